//! The typed async REST client of the registry (feature `client`): one for the CLI, the lab
//! and the bench.
//!
//! Every call returns a [`Reply`]: the body exactly as the registry sent it (what
//! `gangway --json` prints) and its typed form on demand ([`Reply::parse`]). Error answers and
//! transport failures become a [`RestError`]: the registry's refusal with its
//! [`ErrorCode`](crate::ErrorCode), no answer in time, no connection, or an answer from
//! something that is not a registry (another HTTP server, the gRPC port).
//!
//! Timeouts: [`CONNECT_TIMEOUT`] to connect, [`CALL_TIMEOUT`] for an ordinary call, a drain's
//! or readiness wait's own timeout plus [`DRAIN_GRACE`], none for a watch.
//!
//! Several nodes: `RestClient::new("a:8848,b:8848")` names the nodes of one registry
//! (docs/cluster.md, "Client failover"). A call goes to the node that answered last (the first
//! one at the start) and, when that one does not answer, to the next ones in the given order,
//! each at most once per call: on a failed connection (refused, [`CONNECT_TIMEOUT`], no such
//! host) for every call, on a `503` answer (a node warming up, overloaded or stopping) for
//! every call, and on a timeout or broken connection only for reads (`GET`, whose repetition
//! changes nothing; a write that timed out may have taken effect). Each node gets the call's
//! whole timeout, so a read may take up to the number of nodes times it. When every node failed
//! that way, the error is one [`RestError::Unreachable`] naming each node with its failure; when
//! the last node answers 503, that answer is the error.
//!
//! ```no_run
//! use gangway_wire::client::{RestClient, ServiceRef};
//!
//! # async fn demo() -> Result<(), gangway_wire::client::RestError> {
//! let registry = RestClient::new("127.0.0.1:8848")?;
//! let view = registry.instances(&ServiceRef::named("orders"), false).await?.parse()?;
//! println!("orders at revision {}: {} serving", view.revision, view.instances.len());
//! # Ok(())
//! # }
//! ```

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gangway_core::model::{InstanceKey, ServiceKey};
use serde::de::DeserializeOwned;

use crate::rest::{
    ClusterView, DrainReport, DrainRequest, Health, HeartbeatAnswer, InstanceChange,
    OfflineRequest, OnlineRequest, PatchRequest, RegisterRequest, Revision, Service, ServiceList,
    SettingsRequest, Subscribers, View,
};

mod error;
mod sse;
mod tls;

pub use error::{GRPC_PORT_HINT, NO_TLS, RestError};

/// Time allowed to open a TCP connection to the registry: 5 s.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time allowed for an ordinary call (everything but drain, readiness and watch): 30 s.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Extra time a drain or readiness call gets on top of its own timeout, for the answer to
/// arrive: 10 s.
pub const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// Most nodes a [`RestClient`] may be given: 64.
pub const MAX_SERVERS: usize = 64;

/// A client of one registry's REST API, on one node or failing over between several (module
/// docs). Cheap to clone (the connection pool and the node that answered last are shared).
#[derive(Debug, Clone)]
pub struct RestClient {
    http: reqwest::Client,
    /// The nodes, in the given order; never empty.
    targets: Arc<[Target]>,
    /// Index of the node that answered last: where the next call starts.
    preferred: Arc<AtomicUsize>,
    /// As the caller gave it, for messages.
    server: String,
    call_timeout: Duration,
}

/// One node of a [`RestClient`].
#[derive(Debug)]
struct Target {
    /// `http://host:port`, no trailing slash.
    base: String,
    /// As the caller gave it, for messages.
    server: String,
}

/// Settings of a [`RestClient`] before it is built ([`RestClient::builder`]).
#[derive(Debug)]
pub struct Builder {
    server: String,
    user_agent: String,
    connect_timeout: Duration,
    call_timeout: Duration,
    token: Option<String>,
    ca_pem: Option<Vec<u8>>,
    identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    http: Option<reqwest::Client>,
}

/// Names a service in a call. `None` leaves the namespace or group to the registry's default
/// (`public`, `DEFAULT_GROUP`): nothing is sent for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    /// Service name.
    pub service: String,
    /// Namespace, if not the registry's default.
    pub namespace: Option<String>,
    /// Group, if not the registry's default.
    pub group: Option<String>,
}

/// Names an instance in a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRef {
    /// Its service.
    pub service: ServiceRef,
    /// IP literal (IPv6 without brackets) or host name.
    pub ip: String,
    /// TCP port.
    pub port: u16,
    /// Cluster, if not the registry's default (`DEFAULT`).
    pub cluster: Option<String>,
}

/// A successful answer: its raw body and, on demand, its typed form.
#[derive(Debug)]
pub struct Reply<T> {
    /// The body as received (JSON).
    pub body: String,
    kind: PhantomData<fn() -> T>,
}

/// An open `watch` event stream ([`RestClient::watch`]).
#[derive(Debug)]
pub struct Watch {
    resp: reqwest::Response,
    events: sse::EventParser,
    server: String,
}

impl RestClient {
    /// A client of the registry at `server` (`host:port`, or a full `http://` or `https://`
    /// URL; `https://` needs the cargo feature `tls`; or several of them separated by commas,
    /// the nodes of one registry, at most [`MAX_SERVERS`]: module docs) with the default
    /// timeouts.
    ///
    /// # Errors
    /// [`RestError::Transport`] when the HTTP client cannot be set up (no TLS or DNS backend).
    pub fn new(server: &str) -> Result<Self, RestError> {
        Self::builder(server).build()
    }

    /// Settings for a client of `server`: user agent `gangway/<version>`, [`CONNECT_TIMEOUT`],
    /// [`CALL_TIMEOUT`].
    pub fn builder(server: &str) -> Builder {
        Builder {
            server: server.to_owned(),
            user_agent: concat!("gangway/", env!("CARGO_PKG_VERSION")).to_owned(),
            connect_timeout: CONNECT_TIMEOUT,
            call_timeout: CALL_TIMEOUT,
            token: None,
            ca_pem: None,
            identity_pem: None,
            http: None,
        }
    }

    /// The registry's address (or comma-separated addresses) as given.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The node addresses, as given, in order.
    pub fn servers(&self) -> impl Iterator<Item = &str> {
        self.targets.iter().map(|t| t.server.as_str())
    }

    /// `GET /v1/health`.
    ///
    /// # Errors
    /// Every call fails with a [`RestError`]: the registry's refusal ([`RestError::Status`]),
    /// no connection, no answer within the call's timeout, or an answer that is not the
    /// registry's.
    pub async fn health(&self) -> Result<Reply<Health>, RestError> {
        self.send(self.http.get(self.url("/v1/health")), self.call_timeout)
            .await
    }

    /// `GET /v1/cluster`: the nodes of the cluster (`mode` `single` for a node alone).
    ///
    /// # Errors
    /// As [`health`](Self::health); `not_found` from a registry older than cluster mode.
    pub async fn cluster(&self) -> Result<Reply<ClusterView>, RestError> {
        self.send(self.http.get(self.url("/v1/cluster")), self.call_timeout)
            .await
    }

    /// `GET /v1/services`, optionally only one namespace and/or group.
    ///
    /// # Errors
    /// As [`health`](Self::health).
    pub async fn services(
        &self,
        namespace: Option<&str>,
        group: Option<&str>,
    ) -> Result<Reply<ServiceList>, RestError> {
        let query: Vec<(&str, &str)> = [("namespace", namespace), ("group", group)]
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect();
        let req = self.http.get(self.url("/v1/services")).query(&query);
        self.send(req, self.call_timeout).await
    }

    /// `GET /v1/services/{service}`.
    ///
    /// # Errors
    /// As [`health`](Self::health); `not_found` for a service the registry does not know.
    pub async fn service(&self, svc: &ServiceRef) -> Result<Reply<Service>, RestError> {
        let req = self.http.get(self.service_url(svc, "")).query(&svc.query());
        self.send(req, self.call_timeout).await
    }

    /// `PUT /v1/services/{service}`: changes the settings `body` sets; answers the service.
    ///
    /// # Errors
    /// As [`health`](Self::health); `invalid_argument` for a threshold outside 0..=1 or bad
    /// metadata.
    pub async fn put_settings(
        &self,
        svc: &ServiceRef,
        body: &SettingsRequest,
    ) -> Result<Reply<Service>, RestError> {
        let req = self.http.put(self.service_url(svc, "")).query(&svc.query());
        self.send(req.json(body), self.call_timeout).await
    }

    /// `GET /v1/services/{service}/instances`: the consumer view, or with `all` every instance
    /// whatever its state.
    ///
    /// # Errors
    /// As [`health`](Self::health).
    pub async fn instances(&self, svc: &ServiceRef, all: bool) -> Result<Reply<View>, RestError> {
        let mut query = svc.query();
        if all {
            query.push(("all", "true"));
        }
        let req = self
            .http
            .get(self.service_url(svc, "/instances"))
            .query(&query);
        self.send(req, self.call_timeout).await
    }

    /// `POST /v1/services/{service}/instances`.
    ///
    /// # Errors
    /// As [`health`](Self::health); `invalid_argument` naming the field, `conflict` for an
    /// instance of the other kind than the service's.
    pub async fn register(
        &self,
        svc: &ServiceRef,
        body: &RegisterRequest,
    ) -> Result<Reply<InstanceChange>, RestError> {
        let req = self
            .http
            .post(self.service_url(svc, "/instances"))
            .query(&svc.query());
        self.send(req.json(body), self.call_timeout).await
    }

    /// `PATCH /v1/services/{service}/instances/{addr}`.
    ///
    /// # Errors
    /// As [`health`](Self::health); `not_found` for an unknown instance, `conflict` when the
    /// change would take the last serving instance out without `force`.
    pub async fn update(
        &self,
        inst: &InstanceRef,
        body: &PatchRequest,
    ) -> Result<Reply<InstanceChange>, RestError> {
        let req = self
            .http
            .patch(self.instance_url(inst, ""))
            .query(&inst.query());
        self.send(req.json(body), self.call_timeout).await
    }

    /// `DELETE /v1/services/{service}/instances/{addr}`; `force`: remove it even when a
    /// session keeps it alive.
    ///
    /// # Errors
    /// As [`health`](Self::health); `not_found`, or `conflict` for a session's instance without
    /// `force`.
    pub async fn deregister(
        &self,
        inst: &InstanceRef,
        force: bool,
    ) -> Result<Reply<Revision>, RestError> {
        let mut query = inst.query();
        if force {
            query.push(("force", "true"));
        }
        let req = self.http.delete(self.instance_url(inst, "")).query(&query);
        self.send(req, self.call_timeout).await
    }

    /// `PUT .../instances/{addr}/heartbeat`: renews a lease.
    ///
    /// # Errors
    /// As [`health`](Self::health); `not_found` when the instance is gone, `conflict` when it
    /// is not lease-kept.
    pub async fn heartbeat(&self, inst: &InstanceRef) -> Result<Reply<HeartbeatAnswer>, RestError> {
        let req = self
            .http
            .put(self.instance_url(inst, "/heartbeat"))
            .query(&inst.query());
        self.send(req, self.call_timeout).await
    }

    /// `POST .../instances/{addr}/offline`; `force`: even the last serving instance.
    ///
    /// # Errors
    /// As [`health`](Self::health); `conflict` for the last serving instance without `force`.
    pub async fn offline(
        &self,
        inst: &InstanceRef,
        force: bool,
    ) -> Result<Reply<InstanceChange>, RestError> {
        let req = self
            .http
            .post(self.instance_url(inst, "/offline"))
            .query(&inst.query())
            .json(&OfflineRequest { force });
        self.send(req, self.call_timeout).await
    }

    /// `POST .../instances/{addr}/online` with the body `{}` (a POST is JSON:
    /// docs/security.md refuses form and text POSTs).
    ///
    /// # Errors
    /// As [`health`](Self::health); `not_found`.
    pub async fn online(&self, inst: &InstanceRef) -> Result<Reply<InstanceChange>, RestError> {
        let req = self
            .http
            .post(self.instance_url(inst, "/online"))
            .query(&inst.query())
            .json(&serde_json::json!({}));
        self.send(req, self.call_timeout).await
    }

    /// `POST .../instances/{addr}/online` with `{"wait": true}`: online, then wait until every
    /// live subscriber acked a revision holding the instance, at most `timeout` (millisecond
    /// resolution); answers a [`DrainReport`] whose revision is that revision. The call may
    /// take up to `timeout` plus [`DRAIN_GRACE`].
    ///
    /// # Errors
    /// As [`health`](Self::health); `conflict` when the instance is not in the consumer view
    /// (unhealthy, weight 0).
    pub async fn online_wait(
        &self,
        inst: &InstanceRef,
        timeout: Duration,
    ) -> Result<Reply<DrainReport>, RestError> {
        let body = OnlineRequest {
            wait: true,
            timeout_ms: Some(millis(timeout)),
        };
        let req = self
            .http
            .post(self.instance_url(inst, "/online"))
            .query(&inst.query())
            .json(&body);
        self.send(req, timeout.saturating_add(DRAIN_GRACE)).await
    }

    /// `POST .../instances/{addr}/drain`: offline, then wait until every live subscriber acked
    /// a revision without the instance, at most `timeout` (millisecond resolution). The call
    /// may take up to `timeout` plus [`DRAIN_GRACE`]. A drain that timed out is an answer, not
    /// an error: see [`DrainReport::complete`].
    ///
    /// # Errors
    /// As [`health`](Self::health); `conflict` for the last serving instance without `force`.
    pub async fn drain(
        &self,
        inst: &InstanceRef,
        timeout: Duration,
        force: bool,
    ) -> Result<Reply<DrainReport>, RestError> {
        let body = DrainRequest {
            timeout_ms: Some(millis(timeout)),
            force,
        };
        let req = self
            .http
            .post(self.instance_url(inst, "/drain"))
            .query(&inst.query())
            .json(&body);
        self.send(req, timeout.saturating_add(DRAIN_GRACE)).await
    }

    /// `GET /v1/services/{service}/subscribers`.
    ///
    /// # Errors
    /// As [`health`](Self::health).
    pub async fn subscribers(&self, svc: &ServiceRef) -> Result<Reply<Subscribers>, RestError> {
        let req = self
            .http
            .get(self.service_url(svc, "/subscribers"))
            .query(&svc.query());
        self.send(req, self.call_timeout).await
    }

    /// `GET /v1/services/{service}/watch`: the open event stream; no overall timeout (the
    /// connect timeout applies).
    ///
    /// # Errors
    /// As [`health`](Self::health); [`RestError::NotRegistry`] when the answer is not an event
    /// stream.
    pub async fn watch(&self, svc: &ServiceRef) -> Result<Watch, RestError> {
        let req = self
            .http
            .get(self.service_url(svc, "/watch"))
            .query(&svc.query())
            .header(reqwest::header::ACCEPT, "text/event-stream");
        let (resp, server) = self.execute(req, None).await?;
        let resp = check_status(server, resp).await?;
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !content_type.starts_with("text/event-stream") {
            return Err(RestError::NotRegistry {
                server: server.to_owned(),
                detail: format!(
                    "HTTP {} answered with {} instead of an event stream",
                    status_text(resp.status()),
                    if content_type.is_empty() {
                        "no content type"
                    } else {
                        content_type
                    }
                ),
                hint: None,
            });
        }
        Ok(Watch {
            resp,
            events: sse::EventParser::default(),
            server: server.to_owned(),
        })
    }

    /// `path` on the first node; [`execute`](Self::execute) moves it to the node it tries.
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.targets[0].base)
    }

    fn service_url(&self, svc: &ServiceRef, tail: &str) -> String {
        self.url(&format!("/v1/services/{}{tail}", segment(&svc.service)))
    }

    fn instance_url(&self, inst: &InstanceRef, tail: &str) -> String {
        let tail = format!("/instances/{}{tail}", segment(&inst.addr()));
        self.service_url(&inst.service, &tail)
    }

    async fn send<T>(
        &self,
        req: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Reply<T>, RestError> {
        let (resp, server) = self.execute(req.timeout(timeout), Some(timeout)).await?;
        let transport = |e: reqwest::Error| RestError::from_transport(server, &e, Some(timeout));
        let resp = check_status(server, resp).await?;
        let status = resp.status();
        let body = resp.text().await.map_err(transport)?;
        // Every answer of the REST API is JSON: anything else is some other server.
        if serde_json::from_str::<serde::de::IgnoredAny>(&body).is_err() {
            return Err(RestError::NotRegistry {
                server: server.to_owned(),
                detail: format!("HTTP {}, the answer is not JSON", status_text(status)),
                hint: None,
            });
        }
        Ok(Reply::new(body))
    }

    /// Sends `req` (built for the first node) to the node that answered last, then to the
    /// next ones in order while they do not answer (module docs); returns the answer and the
    /// address of the node that gave it. `timeout`: the call's, for messages.
    ///
    /// # Errors
    /// The failure itself when it does not call for another node or there is only one; else,
    /// when every node failed, [`RestError::Unreachable`] naming each with its failure.
    async fn execute(
        &self,
        req: reqwest::RequestBuilder,
        timeout: Option<Duration>,
    ) -> Result<(reqwest::Response, &str), RestError> {
        let request = req
            .build()
            .map_err(|e| RestError::from_transport(&self.server, &e, timeout))?;
        let read = request.method() == reqwest::Method::GET;
        let n = self.targets.len();
        let start = self.preferred.load(Ordering::Relaxed) % n;
        let mut failures: Vec<(&str, RestError)> = Vec::new();
        for k in 0..n {
            let i = (start + k) % n;
            let target = &self.targets[i];
            let last = k + 1 == n;
            // Every body this client sends is bytes, which copy.
            let mut attempt = request.try_clone().ok_or_else(|| RestError::Transport {
                server: target.server.clone(),
                reason: "a streamed request body cannot be sent again".to_owned(),
            })?;
            if i != 0 {
                *attempt.url_mut() = rebase(request.url(), &self.targets[0], target)?;
            }
            let error = match self.http.execute(attempt).await {
                Ok(resp) if resp.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE && !last => {
                    let body = resp.text().await.unwrap_or_default();
                    RestError::from_answer(&target.server, 503, Some("Service Unavailable"), &body)
                }
                Ok(resp) => {
                    // The last node's 503 is the answer, but no reason to start there next.
                    if resp.status() != reqwest::StatusCode::SERVICE_UNAVAILABLE {
                        self.preferred.store(i, Ordering::Relaxed);
                    }
                    return Ok((resp, &target.server));
                }
                Err(e) => {
                    let error = RestError::from_transport(&target.server, &e, timeout);
                    let next = match error {
                        RestError::Unreachable { .. } => true,
                        RestError::Timeout { .. } => e.is_connect() || read,
                        RestError::Transport { .. } => read,
                        _ => false,
                    };
                    if !next || n == 1 {
                        return Err(error);
                    }
                    error
                }
            };
            failures.push((&target.server, error));
        }
        Err(all_failed(&self.server, failures))
    }
}

/// `url`, built on the node `from`, moved to the node `to`: its scheme, host, port and path
/// prefix, the rest of the path and the query kept.
fn rebase(url: &reqwest::Url, from: &Target, to: &Target) -> Result<reqwest::Url, RestError> {
    let rest = url
        .as_str()
        .strip_prefix(from.base.as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| {
            let mut rest = url.path().to_owned();
            if let Some(q) = url.query() {
                rest.push('?');
                rest.push_str(q);
            }
            rest
        });
    reqwest::Url::parse(&format!("{}{rest}", to.base)).map_err(|e| RestError::Transport {
        server: to.server.clone(),
        reason: format!("not a valid address: {e}"),
    })
}

/// The error of a call that no node answered: the failure itself with one node, else one
/// [`RestError::Unreachable`] naming every node with its failure (`a:1: reason; b:2: reason`).
fn all_failed(server: &str, mut failures: Vec<(&str, RestError)>) -> RestError {
    if failures.len() == 1 {
        return failures.remove(0).1;
    }
    let reason = failures
        .iter()
        .map(|(node, e)| format!("{node}: {}", failure_reason(e)))
        .collect::<Vec<_>>()
        .join("; ");
    RestError::Unreachable {
        server: server
            .split(',')
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(", "),
        reason,
    }
}

/// What one node's failure was, without the node's address (the caller names it).
fn failure_reason(e: &RestError) -> String {
    match e {
        RestError::Unreachable { reason, .. } | RestError::Transport { reason, .. } => {
            reason.clone()
        }
        RestError::Timeout { after, .. } => format!(
            "no answer within {}",
            gangway_core::duration::format(*after)
        ),
        other => other.to_string(),
    }
}

/// The error of a non-2xx answer from `server`, or the answer itself.
async fn check_status(
    server: &str,
    resp: reqwest::Response,
) -> Result<reqwest::Response, RestError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let body = resp.text().await.unwrap_or_default();
    Err(RestError::from_answer(
        server,
        status.as_u16(),
        status.canonical_reason(),
        &body,
    ))
}

impl Builder {
    /// The `User-Agent` header (default `gangway/<version>`).
    pub fn user_agent(mut self, user_agent: &str) -> Self {
        user_agent.clone_into(&mut self.user_agent);
        self
    }

    /// Time allowed to connect (default [`CONNECT_TIMEOUT`]).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Time allowed for an ordinary call (default [`CALL_TIMEOUT`]); drains and readiness
    /// waits take their own timeout plus [`DRAIN_GRACE`], watches none.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sends `Authorization: Bearer <token>` on every request when `token` is given (a
    /// registry with `--auth`); default none. The header is marked sensitive (kept out of
    /// debug output). With [`http`](Self::http) the caller's client sends its own headers
    /// and this does not apply.
    pub fn token(mut self, token: Option<&str>) -> Self {
        self.token = token.map(str::to_owned);
        self
    }

    /// Trusts the PEM CA certificates in `pem` (one or more) instead of the system's roots
    /// for an `https://` address, as curl's `--cacert` (a private CA); `None` (the default):
    /// the system's roots. A bundle without a certificate is refused at
    /// [`build`](Self::build) ([`RestError::Tls`]); a build without the cargo feature `tls`
    /// refuses any.
    pub fn ca_pem(mut self, pem: Option<Vec<u8>>) -> Self {
        self.ca_pem = pem;
        self
    }

    /// Presents the PEM client certificate `cert` with its PEM private key `key` to a
    /// registry that requires client certificates (`--tls-client-ca`); default none. Text that
    /// is not a certificate and key is refused at [`build`](Self::build) ([`RestError::Tls`]);
    /// a build without the cargo feature `tls` refuses any.
    pub fn identity_pem(mut self, cert: Vec<u8>, key: Vec<u8>) -> Self {
        self.identity_pem = Some((cert, key));
        self
    }

    /// Sends through `http` (its pool, its connect timeout, user agent and TLS) instead of a
    /// client of its own: [`user_agent`](Self::user_agent),
    /// [`connect_timeout`](Self::connect_timeout), [`ca_pem`](Self::ca_pem) and
    /// [`identity_pem`](Self::identity_pem) no longer apply.
    pub fn http(mut self, http: reqwest::Client) -> Self {
        self.http = Some(http);
        self
    }

    /// The client.
    ///
    /// # Errors
    /// [`RestError::Transport`] when the HTTP client cannot be set up, or the token is not
    /// printable ASCII; [`RestError::Tls`] when the CA bundle holds no certificate, the
    /// identity is not a PEM certificate and key, or (without the cargo feature `tls`) an
    /// `https://` address or any TLS file is given ([`NO_TLS`]).
    pub fn build(self) -> Result<RestClient, RestError> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = &self.token {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| RestError::Transport {
                    server: self.server.clone(),
                    reason: "--token: not printable ASCII".to_owned(),
                })?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let http = match self.http {
            Some(http) => http,
            None => tls::with_tls(
                reqwest::Client::builder()
                    .default_headers(headers)
                    .connect_timeout(self.connect_timeout)
                    .user_agent(self.user_agent),
                &self.server,
                self.ca_pem.as_deref(),
                self.identity_pem.as_ref(),
            )?
            .build()
            .map_err(|e| RestError::Transport {
                server: self.server.clone(),
                reason: error::innermost(&e),
            })?,
        };
        let targets: Vec<Target> = self
            .server
            .split(',')
            .map(|server| {
                let server = server.trim();
                let trimmed = server.trim_end_matches('/');
                let base = if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
                    trimmed.to_owned()
                } else {
                    format!("http://{trimmed}")
                };
                Target {
                    base,
                    server: server.to_owned(),
                }
            })
            .collect();
        if targets.len() > MAX_SERVERS {
            return Err(RestError::Transport {
                server: self.server.clone(),
                reason: format!("{} addresses, at most {MAX_SERVERS}", targets.len()),
            });
        }
        Ok(RestClient {
            http,
            targets: targets.into(),
            preferred: Arc::new(AtomicUsize::new(0)),
            server: self.server,
            call_timeout: self.call_timeout,
        })
    }
}

impl ServiceRef {
    /// `service` in the registry's default namespace and group.
    pub fn named(service: &str) -> Self {
        Self {
            service: service.to_owned(),
            namespace: None,
            group: None,
        }
    }

    /// The query naming the namespace and group that are set.
    fn query(&self) -> Vec<(&'static str, &str)> {
        [("namespace", &self.namespace), ("group", &self.group)]
            .into_iter()
            .filter_map(|(k, v)| Some((k, v.as_deref()?)))
            .collect()
    }
}

impl From<&ServiceKey> for ServiceRef {
    /// Namespace and group named explicitly.
    fn from(k: &ServiceKey) -> Self {
        Self {
            service: k.service.clone(),
            namespace: Some(k.namespace.clone()),
            group: Some(k.group.clone()),
        }
    }
}

impl InstanceRef {
    /// The instance at `ip:port` of `service`, in the registry's default cluster.
    pub fn new(service: ServiceRef, ip: &str, port: u16) -> Self {
        Self {
            service,
            ip: ip.to_owned(),
            port,
            cluster: None,
        }
    }

    /// `ip:port`, IPv6 in brackets, as the path names it.
    pub fn addr(&self) -> String {
        InstanceKey::new(&self.ip, self.port, "").addr()
    }

    fn query(&self) -> Vec<(&'static str, &str)> {
        let mut q = self.service.query();
        if let Some(c) = &self.cluster {
            q.push(("cluster", c));
        }
        q
    }
}

impl<T> Reply<T> {
    fn new(body: String) -> Self {
        Self {
            body,
            kind: PhantomData,
        }
    }
}

impl<T: DeserializeOwned> Reply<T> {
    /// The answer in typed form.
    ///
    /// # Errors
    /// [`RestError::Decode`] when the JSON does not have `T`'s shape.
    pub fn parse(&self) -> Result<T, RestError> {
        serde_json::from_str(&self.body).map_err(|e| RestError::Decode {
            what: std::any::type_name::<T>()
                .rsplit("::")
                .next()
                .unwrap_or("answer"),
            reason: e.to_string(),
        })
    }
}

impl Watch {
    /// The next `snapshot` event, `None` when the registry closed the stream.
    ///
    /// Cancellation safe: a chunk read is either whole or not taken.
    ///
    /// # Errors
    /// [`RestError::Transport`] when the stream breaks.
    pub async fn next_snapshot(&mut self) -> Result<Option<Reply<View>>, RestError> {
        loop {
            while let Some(event) = self.events.next_event() {
                if event.name == "snapshot" {
                    return Ok(Some(Reply::new(event.data)));
                }
            }
            match self.resp.chunk().await {
                Ok(Some(chunk)) => self.events.push(&chunk),
                Ok(None) => return Ok(None),
                Err(e) => return Err(RestError::from_transport(&self.server, &e, None)),
            }
        }
    }
}

/// Percent-encodes one path segment: everything but RFC 3986 unreserved characters and `:`
/// (so `1.2.3.4:80` stays readable and `[::1]:80` becomes `%5B::1%5D:80`).
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b':') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `404 Not Found`.
fn status_text(status: reqwest::StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
