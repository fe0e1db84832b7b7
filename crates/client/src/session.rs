//! The background task that owns the session stream (DESIGN §3, §4).
//!
//! One task per [`Client`](crate::Client). It connects, says `Hello`, waits for `Welcome`, then
//! multiplexes requests, replies, pushes, acks and pulls over the one stream. When the stream
//! ends it reconnects with backoff, to the next of the configured addresses (the nodes of one
//! cluster; a single address is a list of one), and, on the new session, re-sends every live
//! registration and subscription and every request still waiting for its reply. Subscribers
//! keep the view they hold until the new session's first snapshot replaces it. All state lives
//! in this task; handles talk to it through [`Command`]s, so no lock is shared with callers.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_core::view::View;
use gangway_proto::v1 as pb;
use gangway_proto::v1::client_message::Kind as Out;
use gangway_proto::v1::registry_client::RegistryClient;
use gangway_proto::v1::server_message::Kind as In;
use gangway_wire::{ErrorCode, proto};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::{Channel, Endpoint};

use crate::subscription::CacheState;
use crate::{ClientConfig, Error, SessionInfo};

/// What handles ask of the session task.
pub(crate) enum Command {
    /// A request answered by a `Reply`.
    Request {
        request: Request,
        reply: oneshot::Sender<Result<pb::Reply, Error>>,
    },
    /// Subscribe (or join an existing subscription of) a service.
    Subscribe {
        service: ServiceKey,
        reply: oneshot::Sender<Result<watch::Receiver<Arc<View>>, Error>>,
    },
    /// One [`Subscription`](crate::Subscription) (and all its clones) went away.
    Unsubscribe { service: ServiceKey },
    /// End the session and the task.
    Close,
}

/// The requests a [`Command::Request`] carries.
pub(crate) enum Request {
    Register {
        service: ServiceKey,
        instance: InstanceKey,
        spec: RegisterSpec,
    },
    Deregister {
        service: ServiceKey,
        instance: InstanceKey,
    },
    Drain {
        service: ServiceKey,
        instance: InstanceKey,
        timeout: Duration,
        force: bool,
    },
    WaitReady {
        service: ServiceKey,
        instance: InstanceKey,
        timeout: Duration,
    },
}

/// What a registration sends, kept to re-send it after a reconnect.
#[derive(Debug, Clone)]
pub(crate) struct RegisterSpec {
    pub(crate) weight: f64,
    pub(crate) metadata: BTreeMap<String, String>,
}

/// Session state published to handles.
#[derive(Debug, Clone, Default)]
pub(crate) struct SessionState {
    /// The latest `Welcome`, kept while disconnected.
    pub(crate) info: Option<SessionInfo>,
    pub(crate) connected: bool,
    /// Why the last connection attempt or session ended.
    pub(crate) last_error: Option<String>,
    /// The last failure of each address tried since the last session came up, in the order
    /// first tried: (address, reason). Cleared when a session is established.
    pub(crate) failures: Vec<(String, String)>,
    /// The registry refused the credentials: the worker stopped for good.
    pub(crate) refused: Option<Error>,
    pub(crate) closed: bool,
}

type RegKey = (ServiceKey, InstanceKey);

/// A message sent and waiting for its `Reply` (or, for a pull, its `Snapshot`).
struct Pending {
    message: Out,
    op: PendingOp,
}

enum PendingOp {
    Register {
        key: RegKey,
        spec: RegisterSpec,
        reply: oneshot::Sender<Result<pb::Reply, Error>>,
    },
    Deregister {
        reply: oneshot::Sender<Result<pb::Reply, Error>>,
    },
    Drain {
        reply: oneshot::Sender<Result<pb::Reply, Error>>,
    },
    WaitReady {
        reply: oneshot::Sender<Result<pb::Reply, Error>>,
    },
    /// A first subscribe; its waiters are in the [`SubEntry`].
    Subscribe {
        service: ServiceKey,
    },
    /// Internal messages whose reply is only logged; never re-sent (a reconnect rebuilds them).
    Restore {
        what: String,
    },
    Pull {
        service: ServiceKey,
    },
}

impl PendingOp {
    /// Internal operations are dropped on disconnect instead of being re-sent.
    fn is_internal(&self) -> bool {
        matches!(self, PendingOp::Restore { .. } | PendingOp::Pull { .. })
    }

    /// Answers the caller with `error` (internal operations have none).
    fn fail(self, error: Error) {
        match self {
            PendingOp::Register { reply, .. }
            | PendingOp::Deregister { reply }
            | PendingOp::Drain { reply }
            | PendingOp::WaitReady { reply } => {
                let _ = reply.send(Err(error));
            }
            _ => {}
        }
    }

    /// The caller gave up (timed out or dropped the future): not worth re-sending.
    fn abandoned(&self) -> bool {
        match self {
            PendingOp::Register { reply, .. }
            | PendingOp::Deregister { reply }
            | PendingOp::Drain { reply }
            | PendingOp::WaitReady { reply } => reply.is_closed(),
            _ => false,
        }
    }
}

struct SubEntry {
    /// Subscriptions handed out plus callers waiting for the first `Reply`.
    users: usize,
    /// Registry confirmed the subscription on some session.
    confirmed: bool,
    waiters: Vec<oneshot::Sender<Result<watch::Receiver<Arc<View>>, Error>>>,
    tx: watch::Sender<Arc<View>>,
    cache: CacheState,
    pull_in_flight: Option<u64>,
}

/// One established session.
struct Conn {
    // Kept so the connection outlives the handshake for as long as the stream runs.
    _client: RegistryClient<Channel>,
    out: mpsc::UnboundedSender<pb::ClientMessage>,
    inbound: tonic::Streaming<pb::ServerMessage>,
    welcome: pb::Welcome,
}

/// The session task's state.
pub(crate) struct Worker {
    config: ClientConfig,
    /// One per [`ClientConfig::addresses`], same order.
    endpoints: Vec<Endpoint>,
    /// Index of the address the session is on, or the next attempt goes to.
    current: usize,
    commands: mpsc::UnboundedReceiver<Command>,
    state: watch::Sender<SessionState>,
    /// Live registrations confirmed by the registry, restored after each reconnect.
    registrations: BTreeMap<RegKey, RegisterSpec>,
    subscriptions: HashMap<ServiceKey, SubEntry>,
    pending: BTreeMap<u64, Pending>,
    next_id: u64,
    out: Option<mpsc::UnboundedSender<pb::ClientMessage>>,
    /// This client's id, the same on each of its sessions (`Hello.client_id`): the registry
    /// lets a new session take over the instances of an old one it has not seen close yet.
    client_id: String,
    /// The registry said it is going away (`GoAway`): reconnect at once, without backoff.
    go_away: Option<String>,
}

impl Worker {
    pub(crate) fn new(
        config: ClientConfig,
        endpoints: Vec<Endpoint>,
        commands: mpsc::UnboundedReceiver<Command>,
        state: watch::Sender<SessionState>,
    ) -> Self {
        let n = endpoints.len();
        let current = if config.random_start && n > 1 {
            rand::random_range(0..n)
        } else {
            0
        };
        Self {
            config,
            endpoints,
            current,
            commands,
            state,
            registrations: BTreeMap::new(),
            subscriptions: HashMap::new(),
            pending: BTreeMap::new(),
            next_id: 1,
            out: None,
            client_id: format!("{:016x}", rand::random::<u64>()),
            go_away: None,
        }
    }

    /// Connect, serve, reconnect with backoff (to the next address after each failed attempt
    /// or ended session), until closed or every handle is gone.
    pub(crate) async fn run(mut self) {
        let mut backoff = self.config.backoff_initial;
        loop {
            let address = self.config.addresses[self.current].clone();
            let connect = open(
                self.endpoints[self.current].clone(),
                self.config.client_name.clone(),
                self.client_id.clone(),
                self.config.token.clone(),
                self.attempt_deadline(),
            );
            tokio::pin!(connect);
            let opened = loop {
                tokio::select! {
                    res = &mut connect => break res,
                    cmd = self.commands.recv() => if !self.on_command(cmd) { return self.finish() },
                }
            };
            match opened {
                Ok(conn) => {
                    backoff = self.config.backoff_initial;
                    if !self.serve(conn, &address).await {
                        return self.finish();
                    }
                    self.advance();
                    if self.go_away.take().is_some() {
                        continue; // the node is stopping: go to the next one at once
                    }
                }
                Err(OpenFailure::Retry(reason)) => {
                    tracing::debug!(%address, %reason, "gangway connect failed");
                    self.state.send_modify(|s| {
                        match s.failures.iter_mut().find(|(a, _)| *a == address) {
                            Some((_, last)) => last.clone_from(&reason),
                            None => s.failures.push((address, reason.clone())),
                        }
                        s.last_error = Some(reason);
                    });
                    self.advance();
                }
                Err(OpenFailure::Refused { code, message }) => {
                    // Credentials do not get better by retrying: stop, and say why. The nodes
                    // of one cluster share their users and tokens, so no other node is tried.
                    let error = Error::Unauthorized {
                        address,
                        code: ErrorCode::parse(code),
                        message,
                    };
                    tracing::warn!(%error, "gangway session refused; not reconnecting");
                    for (_, pending) in std::mem::take(&mut self.pending) {
                        pending.op.fail(error.clone());
                    }
                    for entry in self.subscriptions.values_mut() {
                        for waiter in entry.waiters.drain(..) {
                            let _ = waiter.send(Err(error.clone()));
                        }
                    }
                    self.state.send_modify(|s| {
                        s.last_error = Some(error.to_string());
                        s.refused = Some(error);
                    });
                    return self.finish();
                }
            }
            let sleep = tokio::time::sleep(jitter(backoff, rand::random::<f64>()));
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    () = &mut sleep => break,
                    cmd = self.commands.recv() => if !self.on_command(cmd) { return self.finish() },
                }
            }
            backoff = (backoff * 2).min(self.config.backoff_max);
        }
    }

    fn finish(&mut self) {
        self.out = None;
        // Dropping the pending replies tells waiting callers the client is closed.
        self.pending.clear();
        self.state.send_modify(|s| {
            s.connected = false;
            s.closed = true;
        });
    }

    /// How long one attempt may take to get its `Welcome`: the request timeout with one
    /// address; with several, at most the connect timeout plus the keepalive timeout (4 s by
    /// default), so that a node that accepts connections but does not answer (frozen) does not
    /// hold the client for its whole request timeout while another node could serve it.
    fn attempt_deadline(&self) -> Duration {
        let c = &self.config;
        if self.endpoints.len() > 1 {
            c.connect_timeout
                .saturating_add(c.keepalive_timeout)
                .min(c.request_timeout)
        } else {
            c.request_timeout
        }
    }

    /// The next attempt goes to the next address, wrapping around.
    fn advance(&mut self) {
        self.current = (self.current + 1) % self.endpoints.len();
    }

    /// Runs one session with the node at `address` until its stream ends (`true`) or the
    /// client closes (`false`).
    async fn serve(&mut self, conn: Conn, address: &str) -> bool {
        let Conn {
            _client,
            out,
            mut inbound,
            welcome,
        } = conn;
        tracing::info!(%address, session = %welcome.session_id, boot = %welcome.boot_id, "gangway session established");
        self.state.send_modify(|s| {
            s.info = Some(SessionInfo {
                session_id: welcome.session_id.clone(),
                boot_id: welcome.boot_id.clone(),
                peer: welcome.peer.clone(),
                address: address.to_owned(),
            });
            s.connected = true;
            s.last_error = None;
            s.failures.clear();
        });
        self.out = Some(out);
        self.restore();

        let refresh = self.config.refresh;
        let mut pull = tokio::time::interval_at(tokio::time::Instant::now() + refresh, refresh);
        pull.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let reason = loop {
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(msg)) => {
                        self.on_server_message(msg);
                        if let Some(reason) = &self.go_away {
                            break format!("the registry is going away: {reason}");
                        }
                    }
                    Ok(None) => break "the registry ended the stream".to_owned(),
                    Err(status) => break format!("stream error: {status}"),
                },
                cmd = self.commands.recv() => if !self.on_command(cmd) { return false },
                _ = pull.tick() => self.pull_all(),
            }
        };
        if self.go_away.is_some() {
            // A planned stop of the registry: not a failure.
            tracing::info!(%address, %reason, "gangway session ended by the registry; reconnecting at once");
        } else {
            tracing::warn!(%address, %reason, "gangway session lost; reconnecting");
        }
        self.out = None;
        self.pending.retain(|_, p| !p.op.is_internal());
        for entry in self.subscriptions.values_mut() {
            entry.cache.fresh = true;
            entry.pull_in_flight = None;
        }
        self.state.send_modify(|s| {
            s.connected = false;
            s.last_error = Some(reason);
        });
        true
    }

    /// On a new session: re-register, re-subscribe, then re-send what still waits for a reply.
    fn restore(&mut self) {
        // Requests that were waiting when the old stream ended go out again, after the
        // registrations and subscriptions they may depend on.
        self.pending.retain(|_, p| !p.op.abandoned());
        let resend: Vec<(u64, Out)> = self
            .pending
            .iter()
            .map(|(id, p)| (*id, p.message.clone()))
            .collect();
        let registrations: Vec<_> = self
            .registrations
            .iter()
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        for ((service, instance), spec) in registrations {
            let what = format!("register {instance} in {service}");
            let message = register_message(&service, &instance, &spec);
            self.issue(message, PendingOp::Restore { what });
        }
        let confirmed: Vec<ServiceKey> = self
            .subscriptions
            .iter()
            .filter(|(_, e)| e.confirmed)
            .map(|(s, _)| s.clone())
            .collect();
        for service in confirmed {
            let what = format!("subscribe {service}");
            let message = Out::Subscribe(pb::Subscribe {
                service: Some(proto::service_to_pb(&service)),
            });
            self.issue(message, PendingOp::Restore { what });
        }
        for (id, message) in resend {
            self.send(id, message);
        }
    }

    /// Handles one command; `false` when the task must end.
    fn on_command(&mut self, cmd: Option<Command>) -> bool {
        let Some(cmd) = cmd else { return false };
        match cmd {
            Command::Close => return false,
            Command::Request { request, reply } => match request {
                Request::Register {
                    service,
                    instance,
                    spec,
                } => {
                    let message = register_message(&service, &instance, &spec);
                    self.issue(
                        message,
                        PendingOp::Register {
                            key: (service, instance),
                            spec,
                            reply,
                        },
                    );
                }
                Request::Deregister { service, instance } => {
                    let message = Out::Deregister(pb::Deregister {
                        service: Some(proto::service_to_pb(&service)),
                        instance: Some(proto::instance_key_to_pb(&instance)),
                    });
                    self.registrations.remove(&(service, instance));
                    self.issue(message, PendingOp::Deregister { reply });
                }
                Request::Drain {
                    service,
                    instance,
                    timeout,
                    force,
                } => {
                    let message = Out::Drain(pb::Drain {
                        service: Some(proto::service_to_pb(&service)),
                        instance: Some(proto::instance_key_to_pb(&instance)),
                        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                        force,
                    });
                    // A drained instance is on its way out: a later reconnect must not bring it
                    // back.
                    self.registrations.remove(&(service, instance));
                    self.issue(message, PendingOp::Drain { reply });
                }
                Request::WaitReady {
                    service,
                    instance,
                    timeout,
                } => {
                    let message = Out::WaitReady(pb::WaitReady {
                        service: Some(proto::service_to_pb(&service)),
                        instance: Some(proto::instance_key_to_pb(&instance)),
                        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                    });
                    self.issue(message, PendingOp::WaitReady { reply });
                }
            },
            Command::Subscribe { service, reply } => self.subscribe(service, reply),
            Command::Unsubscribe { service } => self.release(&service, 1),
        }
        true
    }

    fn subscribe(
        &mut self,
        service: ServiceKey,
        reply: oneshot::Sender<Result<watch::Receiver<Arc<View>>, Error>>,
    ) {
        let entry = self
            .subscriptions
            .entry(service.clone())
            .or_insert_with(|| SubEntry {
                users: 0,
                confirmed: false,
                waiters: Vec::new(),
                tx: watch::Sender::new(Arc::new(View {
                    revision: 0,
                    instances: Vec::new(),
                    protection_triggered: false,
                })),
                cache: CacheState::new(),
                pull_in_flight: None,
            });
        entry.users += 1;
        if entry.confirmed {
            if reply.send(Ok(entry.tx.subscribe())).is_err() {
                self.release(&service, 1);
            }
            return;
        }
        entry.waiters.push(reply);
        if entry.waiters.len() == 1 {
            let message = Out::Subscribe(pb::Subscribe {
                service: Some(proto::service_to_pb(&service)),
            });
            self.issue(message, PendingOp::Subscribe { service });
        }
    }

    /// `n` users of a subscription are gone; unsubscribe when none is left.
    fn release(&mut self, service: &ServiceKey, n: usize) {
        let Some(entry) = self.subscriptions.get_mut(service) else {
            return;
        };
        entry.users = entry.users.saturating_sub(n);
        if entry.users > 0 {
            return;
        }
        let was_confirmed = entry.confirmed;
        self.subscriptions.remove(service);
        if was_confirmed && self.out.is_some() {
            let what = format!("unsubscribe {service}");
            let message = Out::Unsubscribe(pb::Unsubscribe {
                service: Some(proto::service_to_pb(service)),
            });
            self.issue(message, PendingOp::Restore { what });
        }
    }

    /// Records a request and sends it now if connected (else on the next session).
    fn issue(&mut self, message: Out, op: PendingOp) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        if self.out.is_some() || !op.is_internal() {
            self.pending.insert(
                id,
                Pending {
                    message: message.clone(),
                    op,
                },
            );
        }
        self.send(id, message);
        id
    }

    fn send(&self, request_id: u64, kind: Out) {
        if let Some(out) = &self.out {
            // A failed send means the stream is closing; the inbound side notices and
            // reconnects, and pending requests are re-sent then.
            let _ = out.send(pb::ClientMessage {
                request_id,
                kind: Some(kind),
            });
        }
    }

    fn pull_all(&mut self) {
        let due: Vec<(ServiceKey, u64)> = self
            .subscriptions
            .iter()
            .filter(|(_, e)| e.pull_in_flight.is_none())
            .map(|(s, e)| (s.clone(), if e.cache.fresh { 0 } else { e.cache.revision }))
            .collect();
        for (service, known_revision) in due {
            self.pull(&service, known_revision);
        }
    }

    /// Pulls `service` unless a pull of it is in flight (`known_revision` 0: the whole view).
    fn pull(&mut self, service: &ServiceKey, known_revision: u64) {
        if self
            .subscriptions
            .get(service)
            .is_none_or(|e| e.pull_in_flight.is_some())
        {
            return;
        }
        let message = Out::Pull(pb::Pull {
            service: Some(proto::service_to_pb(service)),
            known_revision,
        });
        let id = self.issue(
            message,
            PendingOp::Pull {
                service: service.clone(),
            },
        );
        if let Some(entry) = self.subscriptions.get_mut(service) {
            entry.pull_in_flight = Some(id);
        }
    }

    fn on_server_message(&mut self, msg: pb::ServerMessage) {
        match msg.kind {
            Some(In::Reply(reply)) => match self.pending.remove(&reply.request_id) {
                Some(pending) => self.complete(pending.op, reply),
                None => tracing::debug!(id = reply.request_id, "reply to an unknown request"),
            },
            Some(In::Snapshot(snapshot)) => {
                if snapshot.request_id != 0
                    && let Some(Pending {
                        op: PendingOp::Pull { service },
                        ..
                    }) = self.pending.remove(&snapshot.request_id)
                {
                    self.pull_done(&service);
                }
                self.on_snapshot(snapshot);
            }
            Some(In::Welcome(w)) => {
                tracing::debug!(session = %w.session_id, "unexpected Welcome mid-session");
            }
            Some(In::GoAway(g)) => self.go_away = Some(g.reason),
            None => tracing::debug!("empty server message"),
        }
    }

    fn pull_done(&mut self, service: &ServiceKey) {
        if let Some(entry) = self.subscriptions.get_mut(service) {
            entry.pull_in_flight = None;
        }
    }

    /// Applies a snapshot or delta to its subscription's cache (if the acceptance rule says
    /// so), then acks the revision the cache holds. A delta that does not apply (the cache is
    /// older than its base) is dropped and the whole view pulled instead.
    fn on_snapshot(&mut self, snapshot: pb::Snapshot) {
        let Some(service) = snapshot.service.as_ref().map(proto::service_from_pb) else {
            tracing::warn!("snapshot without a service");
            return;
        };
        let Some(entry) = self.subscriptions.get_mut(&service) else {
            tracing::debug!(%service, "snapshot for a service no longer subscribed");
            return;
        };
        if snapshot.delta {
            if entry
                .cache
                .accept_delta(snapshot.base_revision, snapshot.revision)
            {
                let view = proto::apply_delta(&entry.tx.borrow(), &snapshot);
                entry.tx.send_replace(Arc::new(view));
            } else if entry.cache.fresh || snapshot.revision > entry.cache.revision {
                tracing::debug!(%service, base = snapshot.base_revision, held = entry.cache.revision, "delta does not apply: pulling the whole view");
                self.pull(&service, 0);
                return;
            }
        } else if entry.cache.accept(snapshot.revision) {
            entry
                .tx
                .send_replace(Arc::new(proto::view_from_snapshot(&snapshot)));
        }
        if entry.cache.fresh {
            return; // nothing held yet: nothing to ack
        }
        // The revision the cache holds now: acking an older snapshot's own revision would be
        // harmless (the registry ignores older acks) but acking what we hold is the truth.
        let ack = Out::Ack(pb::Ack {
            service: Some(proto::service_to_pb(&service)),
            revision: entry.cache.revision,
        });
        self.send(0, ack);
    }

    fn complete(&mut self, op: PendingOp, reply: pb::Reply) {
        match op {
            PendingOp::Register {
                key,
                spec,
                reply: tx,
            } => match check_reply(reply) {
                Ok(reply) => {
                    if tx.send(Ok(reply)).is_ok() {
                        self.registrations.insert(key, spec);
                    } else {
                        // The caller gave up and holds no handle: undo, or the instance would
                        // live as long as the session with nobody able to remove it.
                        let (service, instance) = key;
                        let what = format!("undo abandoned register {instance} in {service}");
                        let message = Out::Deregister(pb::Deregister {
                            service: Some(proto::service_to_pb(&service)),
                            instance: Some(proto::instance_key_to_pb(&instance)),
                        });
                        self.issue(message, PendingOp::Restore { what });
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            },
            PendingOp::Deregister { reply: tx }
            | PendingOp::Drain { reply: tx }
            | PendingOp::WaitReady { reply: tx } => {
                let _ = tx.send(check_reply(reply));
            }
            PendingOp::Subscribe { service } => self.subscribed(&service, check_reply(reply)),
            PendingOp::Restore { what } => {
                if let Err(e) = check_reply(reply) {
                    tracing::warn!(%what, error = %e, "gangway restore request failed");
                }
            }
            PendingOp::Pull { service } => {
                self.pull_done(&service);
                match check_reply(reply) {
                    Ok(_) => {} // not modified
                    Err(e) => tracing::debug!(%service, error = %e, "pull refused"),
                }
            }
        }
    }

    fn subscribed(&mut self, service: &ServiceKey, result: Result<pb::Reply, Error>) {
        let Some(entry) = self.subscriptions.get_mut(service) else {
            return;
        };
        let waiters = std::mem::take(&mut entry.waiters);
        match result {
            Ok(_) => {
                entry.confirmed = true;
                let mut gone = 0;
                for w in waiters {
                    if w.send(Ok(entry.tx.subscribe())).is_err() {
                        gone += 1;
                    }
                }
                if gone > 0 {
                    self.release(service, gone);
                }
            }
            Err(e) => {
                let n = waiters.len();
                for w in waiters {
                    let _ = w.send(Err(e.clone()));
                }
                self.release(service, n);
            }
        }
    }
}

/// The delay slept before a reconnect whose backoff is `delay`: drawn from its upper half,
/// `delay/2 + unit * delay/2` for a `unit` sample in 0..1 (clamped), so that the clients of
/// a node that went away spread their reconnects while the delay still bounds the wait.
fn jitter(delay: Duration, unit: f64) -> Duration {
    delay.mul_f64(0.5 + unit.clamp(0.0, 1.0) * 0.5)
}

/// `Ok(reply)` for a success, the registry's refusal ([`Error::Rejected`]) otherwise.
fn check_reply(reply: pb::Reply) -> Result<pb::Reply, Error> {
    match proto::rejection(&reply) {
        Some(refusal) => Err(refusal.into()),
        None => Ok(reply),
    }
}

fn register_message(service: &ServiceKey, instance: &InstanceKey, spec: &RegisterSpec) -> Out {
    Out::Register(pb::Register {
        service: Some(proto::service_to_pb(service)),
        instance: Some(proto::instance_key_to_pb(instance)),
        weight: Some(spec.weight),
        metadata: proto::metadata_to_pb(&spec.metadata),
    })
}

/// Connects, opens the stream, sends `Hello` and waits for `Welcome`, all within `deadline`.
/// Why a session could not be opened.
enum OpenFailure {
    /// Transport, handshake or a transient refusal: try again after the backoff.
    Retry(String),
    /// The registry refused the credentials (`unauthenticated`) or their role (`forbidden`).
    Refused { code: &'static str, message: String },
}

impl From<String> for OpenFailure {
    fn from(reason: String) -> Self {
        OpenFailure::Retry(reason)
    }
}

impl OpenFailure {
    fn of(status: &tonic::Status, what: &str) -> Self {
        let code = match status.code() {
            tonic::Code::Unauthenticated => "unauthenticated",
            tonic::Code::PermissionDenied => "forbidden",
            // The status's message, then its sources (a TLS alert from the registry).
            _ => {
                let cause = std::error::Error::source(status)
                    .map(|s| format!(": {}", describe(s)))
                    .unwrap_or_default();
                return OpenFailure::Retry(format!("{what}: {}{cause}", status.message()));
            }
        };
        OpenFailure::Refused {
            code,
            message: status.message().to_owned(),
        }
    }
}

async fn open(
    endpoint: Endpoint,
    client_name: String,
    client_id: String,
    token: Option<crate::config::Token>,
    deadline: Duration,
) -> Result<Conn, OpenFailure> {
    let handshake = async move {
        let channel = endpoint.connect().await.map_err(|e| describe(&e))?;
        let mut client = RegistryClient::new(channel);
        let (out, rx) = mpsc::unbounded_channel();
        let hello = Out::Hello(pb::Hello {
            client_name,
            client_id,
        });
        out.send(pb::ClientMessage {
            request_id: 0,
            kind: Some(hello),
        })
        .map_err(|_| "request stream closed".to_owned())?;
        let mut request = tonic::Request::new(UnboundedReceiverStream::new(rx));
        if let Some(t) = token {
            let value = format!("Bearer {}", t.expose())
                .parse()
                .map_err(|_| "token: not printable ASCII".to_owned())?;
            request.metadata_mut().insert("authorization", value);
        }
        let response = client
            .session(request)
            .await
            .map_err(|status| OpenFailure::of(&status, "session refused"))?;
        let mut inbound = response.into_inner();
        match inbound.message().await {
            Ok(Some(pb::ServerMessage {
                kind: Some(In::Welcome(welcome)),
            })) => Ok(Conn {
                _client: client,
                out,
                inbound,
                welcome,
            }),
            Ok(Some(other)) => Err(format!("expected Welcome, got {other:?}").into()),
            Ok(None) => Err("stream ended before Welcome".to_owned().into()),
            Err(status) => Err(OpenFailure::of(&status, "stream error before Welcome")),
        }
    };
    match tokio::time::timeout(deadline, handshake).await {
        Ok(result) => result,
        Err(_) => Err(format!("no Welcome within {deadline:?}").into()),
    }
}

/// The error and its sources, since tonic's transport error alone says only "transport error"
/// (a source that says what the one before it said is left out).
fn describe(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut last = text.clone();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if next != last {
            text.push_str(": ");
            text.push_str(&next);
        }
        last = next;
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_the_upper_half_of_the_delay() {
        let d = Duration::from_millis(100);
        assert_eq!(jitter(d, 0.0), Duration::from_millis(50));
        assert_eq!(jitter(d, 1.0), d);
        assert_eq!(jitter(d, 0.5), Duration::from_millis(75));
        assert_eq!(jitter(d, -3.0), Duration::from_millis(50), "clamped");
        assert_eq!(jitter(d, 7.0), d, "clamped");
        assert_eq!(jitter(Duration::from_secs(2), 0.0), Duration::from_secs(1));
    }
}
