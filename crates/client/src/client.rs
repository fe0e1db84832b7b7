//! The client handle, registrations and drain reports.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use gangway_core::drain::DrainReport;
use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_proto::v1 as pb;
use gangway_wire::ErrorCode;
use gangway_wire::proto;
use tokio::sync::{mpsc, oneshot, watch};

use crate::session::{Command, RegisterSpec, Request, SessionState, Worker};
use crate::{ClientConfig, Error, Subscription};

/// A connection to the registry: one session stream per `Client`, shared by its clones.
///
/// Cheap to clone (an `Arc` inside). A background task owns the stream and reconnects with
/// backoff whenever it ends, to the next of [`ClientConfig::addresses`] (the nodes of one
/// cluster); after each reconnect it re-sends every live registration and re-subscribes every
/// live subscription, so a registry restart or the loss of a node restores everything, and
/// subscribers keep their last view until the new session's first snapshot.
///
/// The session ends (and the registry removes this session's instances at once) on
/// [`close`](Self::close) or when the client, all its clones and every [`Registration`] and
/// [`Subscription`] are dropped.
///
/// Must be used inside a Tokio runtime.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    config: ClientConfig,
    commands: mpsc::UnboundedSender<Command>,
    state: watch::Receiver<SessionState>,
}

/// The registry's session, as announced in its `Welcome`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionInfo {
    /// Server-assigned session id, e.g. `s-42`; new on every reconnect.
    pub session_id: String,
    /// Changes on every registry start: a new one means the registry restarted.
    pub boot_id: String,
    /// This client's address as the registry saw it, `ip:port`.
    pub peer: String,
    /// The configured registry address the session is on: one of
    /// [`ClientConfig::addresses`], as given; it changes when the client fails over.
    pub address: String,
}

/// An instance registered through a [`Client`], kept alive by its session.
///
/// Dropping a `Registration` does **not** deregister: the instance stays registered (and is
/// restored after reconnects) until [`deregister`](Self::deregister) or
/// [`drain`](Self::drain) is called, or the whole client goes away (session end).
pub struct Registration {
    client: Client,
    service: ServiceKey,
    instance: InstanceKey,
    revision: u64,
}

/// Outcome of an ack-based readiness wait ([`Registration::ready`]): a [`DrainReport`], where
/// `revision` is the first revision whose consumer view holds the instance and `complete` says
/// every live subscriber acked it (or a later one) in time.
pub type ReadyReport = DrainReport;

impl Client {
    /// Validates `config`, starts the session task and waits for the registry's first
    /// `Welcome`, retrying with backoff for at most `config.request_timeout`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a bad config; [`Error::Unauthorized`] at once when the
    /// registry refuses the token (UNAUTHENTICATED) or its role (PERMISSION_DENIED), without
    /// retrying; [`Error::Connect`] (with the last failure) when no session was established in
    /// time — the background task is stopped then.
    pub async fn connect(config: ClientConfig) -> Result<Client, Error> {
        let client = Client::start(config)?;
        let deadline = client.inner.config.request_timeout;
        match client.first_session(deadline).await {
            Ok(()) => Ok(client),
            Err(e) => {
                client.close();
                Err(e)
            }
        }
    }

    /// Validates `config` and starts the session task without waiting for the registry: the
    /// client connects (and reconnects) with backoff in the background, and requests made
    /// meanwhile wait for the first session, each for at most its timeout. For programs that
    /// must come up before the registry does (`gangway proxy`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a bad config.
    pub fn start(config: ClientConfig) -> Result<Client, Error> {
        config.validate()?;
        let endpoints = config.endpoints()?;
        let (commands, command_rx) = mpsc::unbounded_channel();
        let (state_tx, state) = watch::channel(SessionState::default());
        tokio::spawn(Worker::new(config.clone(), endpoints, command_rx, state_tx).run());
        Ok(Client {
            inner: Arc::new(Inner {
                config,
                commands,
                state,
            }),
        })
    }

    /// Waits for the registry's first `Welcome` (at once when there was one), at most
    /// `timeout`. Cancel-safe.
    ///
    /// # Errors
    /// [`Error::Unauthorized`] at once when the registry refused the credentials;
    /// [`Error::Connect`] with the last connect failure when `timeout` passed first,
    /// [`Error::Closed`] when the client was closed.
    pub async fn first_session(&self, timeout: Duration) -> Result<(), Error> {
        let mut state = self.inner.state.clone();
        let welcomed = tokio::time::timeout(
            timeout,
            state.wait_for(|s| s.info.is_some() || s.refused.is_some()),
        )
        .await
        .map(|r| r.is_ok());
        let refused = state.borrow().refused.clone();
        if let Some(error) = refused {
            return Err(error);
        }
        match welcomed {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::Closed),
            Err(_) => Err(Error::Connect {
                address: self.inner.config.address_list(),
                reason: connect_failure(&state.borrow(), timeout),
            }),
        }
    }

    /// The config this client was built with.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The latest session (kept while reconnecting); `None` only before the first `Welcome`.
    pub fn session(&self) -> Option<SessionInfo> {
        self.inner.state.borrow().info.clone()
    }

    /// The latest session id, e.g. `s-42`.
    pub fn session_id(&self) -> Option<String> {
        self.session().map(|s| s.session_id)
    }

    /// The latest registry boot id; a change means the registry restarted.
    pub fn boot_id(&self) -> Option<String> {
        self.session().map(|s| s.boot_id)
    }

    /// Whether a session stream is up right now.
    pub fn is_connected(&self) -> bool {
        self.inner.state.borrow().connected
    }

    /// Registers `instance` of `service` with `weight` (0..=10000, 0 = never picked) and
    /// `metadata`, bound to this client's session.
    ///
    /// Waits for the registry's answer, at most `request_timeout`; while disconnected the
    /// request waits for the next session. Cancellation: if the call is dropped or times out
    /// and the registry later confirms it, the client deregisters it again.
    ///
    /// # Errors
    /// [`Error::Rejected`] (e.g. `invalid_argument`, `conflict`), [`Error::Timeout`],
    /// [`Error::Closed`].
    pub async fn register(
        &self,
        service: ServiceKey,
        instance: InstanceKey,
        weight: f64,
        metadata: BTreeMap<String, String>,
    ) -> Result<Registration, Error> {
        let request = Request::Register {
            service: service.clone(),
            instance: instance.clone(),
            spec: RegisterSpec { weight, metadata },
        };
        let reply = self.request(request, "register", Duration::ZERO).await?;
        Ok(Registration {
            client: self.clone(),
            service,
            instance,
            revision: reply.revision,
        })
    }

    /// Subscribes to `service`: the returned [`Subscription`] follows its consumer view.
    ///
    /// Returns once the registry accepted the subscription (the first snapshot may come later,
    /// e.g. during the registry's warm-up). Several subscriptions to one service share one
    /// registry subscription.
    ///
    /// # Errors
    /// [`Error::Rejected`], [`Error::Timeout`] after `request_timeout`, [`Error::Closed`].
    pub async fn subscribe(&self, service: ServiceKey) -> Result<Subscription, Error> {
        let (reply, rx) = oneshot::channel();
        self.inner
            .commands
            .send(Command::Subscribe {
                service: service.clone(),
                reply,
            })
            .map_err(|_| self.closed())?;
        let after = self.inner.config.request_timeout;
        let receiver = match tokio::time::timeout(after, rx).await {
            Err(_) => {
                return Err(Error::Timeout {
                    operation: "subscribe",
                    after,
                });
            }
            Ok(Err(_)) => return Err(self.closed()),
            Ok(Ok(result)) => result?,
        };
        Ok(Subscription::new(
            service,
            receiver,
            self.inner.commands.clone(),
        ))
    }

    /// Ends the session now: the registry removes this session's instances at once and pending
    /// requests fail with [`Error::Closed`]. Affects every clone and handle. Idempotent.
    pub fn close(&self) {
        let _ = self.inner.commands.send(Command::Close);
    }

    /// Why no more requests are possible: the registry's refusal of the credentials, if that
    /// stopped the client, else [`Error::Closed`].
    fn closed(&self) -> Error {
        self.inner
            .state
            .borrow()
            .refused
            .clone()
            .unwrap_or(Error::Closed)
    }

    async fn request(
        &self,
        request: Request,
        operation: &'static str,
        extra: Duration,
    ) -> Result<pb::Reply, Error> {
        let (reply, rx) = oneshot::channel();
        self.inner
            .commands
            .send(Command::Request { request, reply })
            .map_err(|_| self.closed())?;
        let after = self.inner.config.request_timeout.saturating_add(extra);
        match tokio::time::timeout(after, rx).await {
            Err(_) => Err(Error::Timeout { operation, after }),
            Ok(Err(_)) => Err(self.closed()),
            Ok(Ok(result)) => result,
        }
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.state.borrow();
        f.debug_struct("Client")
            .field("addresses", &self.inner.config.addresses)
            .field("session", &state.info)
            .field("connected", &state.connected)
            .finish()
    }
}

/// Why no session came up within `timeout`: the last failure, or with several addresses the
/// last failure of each (`a:1: reason; b:2: reason`).
fn connect_failure(state: &SessionState, timeout: Duration) -> String {
    match state.failures.as_slice() {
        [] => state.last_error.clone(),
        [(_, one)] => Some(one.clone()),
        many => Some(
            many.iter()
                .map(|(address, reason)| format!("{address}: {reason}"))
                .collect::<Vec<_>>()
                .join("; "),
        ),
    }
    .unwrap_or_else(|| format!("no session within {timeout:?}"))
}

impl Registration {
    /// The service the instance is registered in.
    pub fn service(&self) -> &ServiceKey {
        &self.service
    }

    /// The registered instance.
    pub fn instance(&self) -> &InstanceKey {
        &self.instance
    }

    /// The service revision right after the registration.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Removes the instance from the registry and stops restoring it on reconnect. An instance
    /// the registry no longer knows (`not_found`, e.g. after a registry restart) counts as
    /// removed.
    ///
    /// # Errors
    /// [`Error::Rejected`], [`Error::Timeout`] after `request_timeout`, [`Error::Closed`].
    pub async fn deregister(&self) -> Result<(), Error> {
        let request = Request::Deregister {
            service: self.service.clone(),
            instance: self.instance.clone(),
        };
        match self
            .client
            .request(request, "deregister", Duration::ZERO)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some(&ErrorCode::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Ack-based drain (DESIGN §4): the registry takes the instance out of the consumer view,
    /// then waits until every live subscriber acked that revision, at most `timeout`
    /// (millisecond resolution; zero takes the registry's default, and then the call may time out
    /// client-side after `request_timeout`). `force` drains even the last serving instance of the
    /// service. The client stops restoring the registration on reconnect; if the session is lost
    /// mid-drain the registry has already dropped the instance, and the re-sent drain fails with
    /// `not_found`.
    ///
    /// Waits up to `timeout + request_timeout`. An incomplete drain is not an error: check
    /// [`DrainReport::complete`] and [`DrainReport::laggards`].
    ///
    /// # Errors
    /// [`Error::Rejected`] (e.g. the last instance without `force`), [`Error::Timeout`],
    /// [`Error::Closed`].
    pub async fn drain(&self, timeout: Duration, force: bool) -> Result<DrainReport, Error> {
        let request = Request::Drain {
            service: self.service.clone(),
            instance: self.instance.clone(),
            timeout,
            force,
        };
        let reply = self.client.request(request, "drain", timeout).await?;
        Ok(proto::drain_from_pb(reply.drain.unwrap_or_default()))
    }

    /// Ack-based readiness (DESIGN §4, the mirror of [`drain`](Self::drain)): waits until every
    /// live subscriber of the service has acked a revision whose consumer view holds this
    /// instance, at most `timeout` (millisecond resolution; zero takes the registry's drain
    /// timeout, and then the call may time out client-side after `request_timeout`). Only then
    /// does traffic really reach the instance: a rollout should move on after this, not after
    /// the registration.
    ///
    /// Waits up to `timeout + request_timeout`. Subscribers that never ack (frozen, partitioned)
    /// make it return at the timeout with [`ReadyReport::complete`] false and them among the
    /// [`ReadyReport::laggards`]; that is not an error. If the session is lost meanwhile the
    /// request is sent again on the next session, after the registration was restored.
    ///
    /// # Errors
    /// [`Error::Rejected`] with code `conflict` when the instance is not in the consumer view
    /// (offline, unhealthy, weight 0) or `not_found` when the registry does not know it;
    /// [`Error::Timeout`], [`Error::Closed`].
    pub async fn ready(&self, timeout: Duration) -> Result<ReadyReport, Error> {
        let request = Request::WaitReady {
            service: self.service.clone(),
            instance: self.instance.clone(),
            timeout,
        };
        let reply = self.client.request(request, "ready", timeout).await?;
        Ok(proto::drain_from_pb(reply.drain.unwrap_or_default()))
    }
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("service", &self.service)
            .field("instance", &self.instance)
            .field("revision", &self.revision)
            .finish_non_exhaustive()
    }
}
