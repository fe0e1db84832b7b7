//! A typed HTTP client for the registry's REST API (docs/api-draft.md).
//!
//! Every call returns a [`Reply`]: the body exactly as the registry sent it (what `--json`
//! prints) and a typed parse of it on demand (what the tables are made from). Error answers
//! (4xx/5xx with the `{"error": {...}}` body) become [`ApiError::Status`].

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

use gangway_client::ClientTls;

use crate::args::{Addr, InstanceArgs, ServiceArgs};
use crate::sse::EventParser;

/// Time allowed to open a TCP connection to the registry.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time allowed for an ordinary call (everything but drain and watch).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Extra time a drain call gets on top of its own timeout, for the answer to arrive.
pub const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// A client of one registry.
#[derive(Debug, Clone)]
pub struct Registry {
    http: reqwest::Client,
    /// `http://host:port`, no trailing slash.
    base: String,
    /// As the user gave it, for messages.
    server: String,
}

/// A successful answer: its raw body and, on demand, its typed form.
#[derive(Debug)]
pub struct Reply<T> {
    /// The body as received.
    pub body: String,
    kind: PhantomData<fn() -> T>,
}

/// An open `watch` event stream.
#[derive(Debug)]
pub struct Watch {
    resp: reqwest::Response,
    events: EventParser,
    server: String,
}

/// Why a call failed.
#[derive(Debug)]
pub enum ApiError {
    /// The registry answered with an error status.
    Status {
        /// HTTP status code.
        status: u16,
        /// `invalid_argument`, `not_found`, `conflict`, ... when the body had one.
        code: Option<String>,
        /// Readable reason (the body's message, or the body itself, or the status text).
        message: String,
        /// The request field at fault, if any.
        field: Option<String>,
    },
    /// No connection could be made.
    Unreachable {
        /// `host:port` as configured.
        server: String,
        /// The innermost cause, e.g. `Connection refused (os error 111)`.
        reason: String,
    },
    /// The call took longer than its timeout.
    Timeout {
        /// `host:port` as configured.
        server: String,
        /// The timeout that ran out.
        after: Duration,
    },
    /// The connection broke or the answer could not be read.
    Transport {
        /// `host:port` as configured.
        server: String,
        /// The innermost cause.
        reason: String,
    },
    /// The answer did not come from a gangway registry: a 4xx or 501 without gangway's error
    /// body, a body that is not JSON where JSON was expected, or not HTTP/1 at all.
    NotRegistry {
        /// `host:port` as configured.
        server: String,
        /// What gave it away, e.g. `HTTP 404 Not Found`.
        detail: String,
        /// What the user may have got wrong (the gRPC port), if we can tell.
        hint: Option<&'static str>,
    },
    /// The TLS handshake with the registry failed (an `https://` address).
    Tls {
        /// `host:port` as configured.
        server: String,
        /// The TLS library's reason, e.g. `invalid peer certificate: UnknownIssuer`.
        reason: String,
        /// What to change (`--ca`, `--client-cert`, the scheme), when we can tell.
        hint: Option<&'static str>,
    },
    /// The answer did not have the expected shape.
    Decode {
        /// What was being read.
        what: &'static str,
        /// The parser's complaint.
        reason: String,
    },
}

/// Instance JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    /// IP literal or host name.
    pub ip: String,
    /// TCP port.
    pub port: u16,
    /// Cluster name.
    #[serde(default)]
    pub cluster: String,
    /// Share of traffic.
    pub weight: f64,
    /// Manual on/offline.
    pub enabled: bool,
    /// Liveness/probe verdict.
    pub healthy: bool,
    /// Ephemeral or persistent.
    pub ephemeral: bool,
    /// Free string map.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// `session`, `lease` or `probe`.
    #[serde(default)]
    pub liveness: Option<String>,
}

impl Instance {
    /// `ip:port`, IPv6 in brackets.
    pub fn addr(&self) -> String {
        Addr {
            host: self.ip.clone(),
            port: self.port,
        }
        .to_string()
    }
}

/// A consumer view (`GET .../instances`, and each `watch` snapshot).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct View {
    /// Namespace.
    #[serde(default)]
    pub namespace: String,
    /// Group.
    #[serde(default)]
    pub group: String,
    /// Service name.
    #[serde(default)]
    pub service: String,
    /// Service revision this view is at.
    pub revision: u64,
    /// Whether the protect threshold put unhealthy instances back in.
    #[serde(default)]
    pub protection_triggered: bool,
    /// Whether the registry is still warming up after a start.
    #[serde(default)]
    pub warming_up: bool,
    /// The instances.
    #[serde(default)]
    pub instances: Vec<Instance>,
}

/// One entry of `GET /v1/services`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceSummary {
    /// Namespace.
    pub namespace: String,
    /// Group.
    pub group: String,
    /// Service name.
    pub service: String,
    /// `ephemeral`, `persistent`, or none yet.
    #[serde(default)]
    pub kind: Option<String>,
    /// Current revision.
    #[serde(default)]
    pub revision: u64,
    /// Number of instances, whatever their state.
    #[serde(default)]
    pub instances: u64,
    /// Number of serving instances.
    #[serde(default)]
    pub serving: u64,
    /// Number of live subscribers.
    #[serde(default)]
    pub subscribers: u64,
    /// Protect threshold, 0..=1.
    #[serde(default)]
    pub protect_threshold: f64,
}

/// `GET /v1/services`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceList {
    /// The services.
    pub services: Vec<ServiceSummary>,
}

/// Body of `POST .../instances`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RegisterRequest {
    /// IP literal or host name.
    pub ip: String,
    /// TCP port.
    pub port: u16,
    /// Cluster; server default `DEFAULT`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Weight; server default 1.0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
    /// Metadata.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// `false` for a persistent (probed) instance.
    pub ephemeral: bool,
    /// Lease TTL, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// Lease delete timeout, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delete_timeout_ms: Option<u64>,
    /// How a persistent instance is probed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
}

/// Probe settings of a persistent instance; unset fields take the server's defaults.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Probe {
    /// `tcp` or `http`.
    pub kind: String,
    /// HTTP path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// Answer of register, offline, online.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceChange {
    /// Revision after the change.
    pub revision: u64,
    /// The instance as it now is.
    pub instance: Instance,
}

/// Answer of deregister.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Revision {
    /// Revision after the change.
    pub revision: u64,
}

/// Answer of heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatAnswer {
    /// The lease TTL, ms: heartbeat at least every third of it.
    pub ttl_ms: u64,
    /// Whether the instance is healthy now.
    pub healthy: bool,
}

/// Body of `POST .../drain`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DrainRequest {
    /// How long to wait for acks, ms.
    pub timeout_ms: u64,
    /// Drain even the last serving instance.
    pub force: bool,
}

/// Body of `POST .../online` that waits for readiness (the mirror of [`DrainRequest`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OnlineWaitRequest {
    /// Always true: answer with a readiness report once every subscriber acked.
    pub wait: bool,
    /// How long to wait for acks, ms.
    pub timeout_ms: u64,
}

/// Answer of drain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrainReport {
    /// Revision the instance went offline at; subscribers had to ack at least this.
    pub revision: u64,
    /// Time waited, ms.
    pub waited_ms: u64,
    /// Whether every live subscriber acked in time.
    pub complete: bool,
    /// Subscribers that acked.
    #[serde(default)]
    pub acked: Vec<SubscriberAck>,
    /// Subscribers that did not ack in time.
    #[serde(default)]
    pub laggards: Vec<SubscriberAck>,
    /// Remarks of the registry.
    #[serde(default)]
    pub notes: Vec<String>,
}

/// A subscriber's ack state in a drain report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubscriberAck {
    /// Subscriber id.
    #[serde(deserialize_with = "string_or_number")]
    pub id: String,
    /// Its network address.
    #[serde(default)]
    pub address: String,
    /// The last revision it acked.
    #[serde(default)]
    pub acked_revision: u64,
}

/// Answer of `GET .../subscribers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subscribers {
    /// Current revision of the service.
    pub revision: u64,
    /// The subscribers.
    #[serde(default)]
    pub subscribers: Vec<Subscriber>,
}

/// One subscriber of a service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subscriber {
    /// Subscriber id.
    #[serde(deserialize_with = "string_or_number")]
    pub id: String,
    /// Its network address.
    #[serde(default)]
    pub address: String,
    /// `session`, `watch` or `poller`.
    #[serde(default)]
    pub kind: String,
    /// Name the client gave, if any.
    #[serde(default)]
    pub client_name: Option<String>,
    /// Last acked revision.
    #[serde(default)]
    pub acked_revision: u64,
    /// When it acked last, Unix ms.
    #[serde(default)]
    pub acked_at_ms: Option<u64>,
    /// Last revision pushed to it.
    #[serde(default)]
    pub pushed_revision: Option<u64>,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    #[serde(default)]
    code: Option<String>,
    message: String,
    #[serde(default)]
    field: Option<String>,
}

impl Registry {
    /// A client of the registry at `server` (`host:port`, or a full `http://` or `https://`
    /// URL), sending `Authorization: Bearer <token>` on every request when a token is given (a
    /// registry with `--auth`), trusting `tls.ca_pem` instead of the system's roots and
    /// presenting `tls.identity` when given. Errors: an unusable address, a token that is not
    /// printable ASCII, or TLS files that hold no certificate or key (naming the flag).
    pub fn new(server: &str, token: Option<&str>, tls: &ClientTls) -> Result<Self, ApiError> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = token {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| ApiError::Transport {
                    server: server.to_owned(),
                    reason: "--token: not printable ASCII".to_owned(),
                })?;
            // Kept out of reqwest's debug output.
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let builder = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("gangway-cli/", env!("CARGO_PKG_VERSION")));
        let http = with_tls(builder, tls, server)?
            .build()
            .map_err(|e| ApiError::Transport {
                server: server.to_owned(),
                reason: innermost(&e),
            })?;
        let base = if server.starts_with("http://") || server.starts_with("https://") {
            server.trim_end_matches('/').to_owned()
        } else {
            format!("http://{}", server.trim_end_matches('/'))
        };
        Ok(Self {
            http,
            base,
            server: server.to_owned(),
        })
    }

    /// `GET /v1/services`, optionally filtered.
    pub async fn services(
        &self,
        namespace: Option<&str>,
        group: Option<&str>,
    ) -> Result<Reply<ServiceList>, ApiError> {
        let mut query = Vec::new();
        if let Some(ns) = namespace {
            query.push(("namespace", ns.to_owned()));
        }
        if let Some(g) = group {
            query.push(("group", g.to_owned()));
        }
        self.send(
            self.http.get(self.url("/v1/services")).query(&query),
            CALL_TIMEOUT,
        )
        .await
    }

    /// `GET /v1/services/{service}/instances[?all=true]`.
    pub async fn instances(&self, svc: &ServiceArgs, all: bool) -> Result<Reply<View>, ApiError> {
        let mut query = service_query(svc);
        if all {
            query.push(("all", "true".to_owned()));
        }
        let url = self.url(&format!("/v1/services/{}/instances", segment(&svc.service)));
        self.send(self.http.get(url).query(&query), CALL_TIMEOUT)
            .await
    }

    /// `POST /v1/services/{service}/instances`.
    pub async fn register(
        &self,
        svc: &ServiceArgs,
        body: &RegisterRequest,
    ) -> Result<Reply<InstanceChange>, ApiError> {
        let url = self.url(&format!("/v1/services/{}/instances", segment(&svc.service)));
        let req = self.http.post(url).query(&service_query(svc)).json(body);
        self.send(req, CALL_TIMEOUT).await
    }

    /// `DELETE /v1/services/{service}/instances/{addr}`.
    /// `force`: remove it even when a session keeps it alive.
    pub async fn deregister(
        &self,
        inst: &InstanceArgs,
        force: bool,
    ) -> Result<Reply<Revision>, ApiError> {
        let mut query = instance_query(inst);
        if force {
            query.push(("force", "true".into()));
        }
        let req = self.http.delete(self.instance_url(inst, "")).query(&query);
        self.send(req, CALL_TIMEOUT).await
    }

    /// `PUT .../instances/{addr}/heartbeat`.
    pub async fn heartbeat(&self, inst: &InstanceArgs) -> Result<Reply<HeartbeatAnswer>, ApiError> {
        let req = self
            .http
            .put(self.instance_url(inst, "/heartbeat"))
            .query(&instance_query(inst));
        self.send(req, CALL_TIMEOUT).await
    }

    /// `POST .../instances/{addr}/offline`; `force`: even the last serving instance.
    pub async fn offline(
        &self,
        inst: &InstanceArgs,
        force: bool,
    ) -> Result<Reply<InstanceChange>, ApiError> {
        let req = self
            .http
            .post(self.instance_url(inst, "/offline"))
            .query(&instance_query(inst))
            .json(&serde_json::json!({ "force": force }));
        self.send(req, CALL_TIMEOUT).await
    }

    /// `POST .../instances/{addr}/online`.
    pub async fn online(&self, inst: &InstanceArgs) -> Result<Reply<InstanceChange>, ApiError> {
        let req = self
            .http
            .post(self.instance_url(inst, "/online"))
            .query(&instance_query(inst))
            // A POST is JSON (docs/security.md: no form or text POST from a web page).
            .json(&serde_json::json!({}));
        self.send(req, CALL_TIMEOUT).await
    }

    /// `POST .../instances/{addr}/online` with `{"wait": true}`: online, then wait until every
    /// live subscriber acked a revision holding the instance; answers a [`DrainReport`] whose
    /// revision is that revision. The call may take up to `timeout` plus [`DRAIN_GRACE`].
    pub async fn online_wait(
        &self,
        inst: &InstanceArgs,
        timeout: Duration,
    ) -> Result<Reply<DrainReport>, ApiError> {
        let body = OnlineWaitRequest {
            wait: true,
            timeout_ms: millis(timeout),
        };
        let req = self
            .http
            .post(self.instance_url(inst, "/online"))
            .query(&instance_query(inst))
            .json(&body);
        self.send(req, timeout.saturating_add(DRAIN_GRACE)).await
    }

    /// `POST .../instances/{addr}/drain`; the call may take up to `timeout` plus [`DRAIN_GRACE`].
    pub async fn drain(
        &self,
        inst: &InstanceArgs,
        timeout: Duration,
        force: bool,
    ) -> Result<Reply<DrainReport>, ApiError> {
        let body = DrainRequest {
            timeout_ms: millis(timeout),
            force,
        };
        let req = self
            .http
            .post(self.instance_url(inst, "/drain"))
            .query(&instance_query(inst))
            .json(&body);
        self.send(req, timeout.saturating_add(DRAIN_GRACE)).await
    }

    /// `GET /v1/services/{service}/subscribers`.
    pub async fn subscribers(&self, svc: &ServiceArgs) -> Result<Reply<Subscribers>, ApiError> {
        let url = self.url(&format!(
            "/v1/services/{}/subscribers",
            segment(&svc.service)
        ));
        self.send(self.http.get(url).query(&service_query(svc)), CALL_TIMEOUT)
            .await
    }

    /// `GET /v1/services/{service}/watch`: the open event stream (no overall timeout).
    pub async fn watch(&self, svc: &ServiceArgs) -> Result<Watch, ApiError> {
        let url = self.url(&format!("/v1/services/{}/watch", segment(&svc.service)));
        let req = self
            .http
            .get(url)
            .query(&service_query(svc))
            .header(reqwest::header::ACCEPT, "text/event-stream");
        let resp = req
            .send()
            .await
            .map_err(|e| self.transport_error(&e, None))?;
        let resp = check_status(&self.server, resp).await?;
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !content_type.starts_with("text/event-stream") {
            return Err(ApiError::NotRegistry {
                server: self.server.clone(),
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
            events: EventParser::default(),
            server: self.server.clone(),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    fn instance_url(&self, inst: &InstanceArgs, tail: &str) -> String {
        self.url(&format!(
            "/v1/services/{}/instances/{}{}",
            segment(&inst.service.service),
            segment(&inst.addr.to_string()),
            tail
        ))
    }

    async fn send<T>(
        &self,
        req: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Reply<T>, ApiError> {
        let resp = req
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.transport_error(&e, Some(timeout)))?;
        let resp = check_status(&self.server, resp).await?;
        let status = resp.status();
        let body = resp
            .text()
            .await
            .map_err(|e| self.transport_error(&e, Some(timeout)))?;
        // Every answer of the REST API is JSON: anything else is some other server.
        if serde_json::from_str::<serde::de::IgnoredAny>(&body).is_err() {
            return Err(ApiError::NotRegistry {
                server: self.server.clone(),
                detail: format!("HTTP {}, the answer is not JSON", status_text(status)),
                hint: None,
            });
        }
        Ok(Reply {
            body,
            kind: PhantomData,
        })
    }

    fn transport_error(&self, e: &reqwest::Error, timeout: Option<Duration>) -> ApiError {
        let server = self.server.clone();
        #[cfg(feature = "tls")]
        if let Some(tls) = tls_error(e) {
            return ApiError::Tls {
                server,
                reason: tls.to_string(),
                hint: tls_hint(tls),
            };
        }
        let reason = innermost(e);
        if speaks_http2_only(&reason) {
            return ApiError::NotRegistry {
                server,
                detail: reason,
                hint: Some(GRPC_PORT_HINT),
            };
        }
        match timeout {
            Some(after) if e.is_timeout() => ApiError::Timeout { server, after },
            _ if e.is_connect() => ApiError::Unreachable {
                server,
                reason: innermost(e),
            },
            _ => ApiError::Transport {
                server,
                reason: innermost(e),
            },
        }
    }
}

/// `builder` with the CA and client identity of `tls`. Errors: PEM text without a certificate
/// or key ([`ApiError::Tls`] naming the flag), or TLS asked of a build without it.
#[cfg(feature = "tls")]
fn with_tls(
    mut builder: reqwest::ClientBuilder,
    tls: &ClientTls,
    server: &str,
) -> Result<reqwest::ClientBuilder, ApiError> {
    let bad = |reason: String| ApiError::Tls {
        server: server.to_owned(),
        reason,
        hint: None,
    };
    if let Some(pem) = &tls.ca_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| bad(format!("--ca: {}", innermost(&e))))?;
        if certs.is_empty() {
            return Err(bad("--ca: no PEM certificate in the file".to_owned()));
        }
        builder = builder.tls_built_in_root_certs(false);
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    if let Some(id) = &tls.identity {
        let pem = [id.cert_pem.as_slice(), b"\n", id.key_pem.as_slice()].concat();
        let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
            bad(format!(
                "--client-cert/--client-key: not a PEM certificate and key ({})",
                innermost(&e)
            ))
        })?;
        builder = builder.identity(identity);
    }
    Ok(builder)
}

/// Without TLS support, an `https://` address or a TLS file is refused.
#[cfg(not(feature = "tls"))]
fn with_tls(
    builder: reqwest::ClientBuilder,
    tls: &ClientTls,
    server: &str,
) -> Result<reqwest::ClientBuilder, ApiError> {
    if server.starts_with("https://") || tls.ca_pem.is_some() || tls.identity.is_some() {
        return Err(ApiError::Tls {
            server: server.to_owned(),
            reason: crate::tls::NO_TLS.to_owned(),
            hint: None,
        });
    }
    Ok(builder)
}

/// The TLS error among `e`'s sources, if any. An I/O error may carry it, inside another I/O
/// error: `io::Error::source` skips the error it wraps, so that one is looked at directly.
#[cfg(feature = "tls")]
fn tls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(e);
    while let Some(cur) = next {
        if let Some(tls) = cur.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        next = match cur
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => cur.source(),
        };
    }
    None
}

/// What to change after a TLS failure, when it says.
#[cfg(feature = "tls")]
fn tls_hint(e: &rustls::Error) -> Option<&'static str> {
    use rustls::AlertDescription as Alert;
    match e {
        rustls::Error::InvalidCertificate(_) => Some(
            "the registry's certificate is not trusted: pass --ca FILE (or GANGWAY_CA) with the \
             CA that signed it",
        ),
        rustls::Error::AlertReceived(
            Alert::CertificateRequired | Alert::BadCertificate | Alert::UnknownCA,
        ) => Some(
            "the registry requires a client certificate it trusts: pass --client-cert FILE \
             --client-key FILE",
        ),
        rustls::Error::InvalidMessage(_) => {
            Some("the registry does not seem to speak TLS on this port: try http://")
        }
        _ => None,
    }
}

/// Added to errors that suggest `--server` names the registry's gRPC (HTTP/2-only) port.
pub const GRPC_PORT_HINT: &str = "is this the gRPC port? the REST port is usually 8848 (a registry that serves TLS needs https://)";

/// Whether a transport failure reads like an HTTP/2-only server (gRPC) answering HTTP/1.1:
/// hyper either parses the server's SETTINGS frame as a response ("invalid HTTP version
/// parsed") or sees it arrive before the request went out ("received unexpected message from
/// connection").
fn speaks_http2_only(reason: &str) -> bool {
    let r = reason.to_ascii_lowercase();
    [
        "invalid http version",
        "unexpected message from connection",
        "http/2",
        "http2",
    ]
    .iter()
    .any(|s| r.contains(s))
}

/// `404 Not Found`.
fn status_text(status: reqwest::StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

impl Watch {
    /// The next `snapshot` event, `None` when the registry closed the stream.
    ///
    /// Cancellation safe: a chunk read is either whole or not taken.
    pub async fn next_snapshot(&mut self) -> Result<Option<Reply<View>>, ApiError> {
        loop {
            while let Some(event) = self.events.next_event() {
                if event.name == "snapshot" {
                    return Ok(Some(Reply {
                        body: event.data,
                        kind: PhantomData,
                    }));
                }
            }
            match self.resp.chunk().await {
                Ok(Some(chunk)) => self.events.push(&chunk),
                Ok(None) => return Ok(None),
                Err(e) => {
                    return Err(ApiError::Transport {
                        server: self.server.clone(),
                        reason: innermost(&e),
                    });
                }
            }
        }
    }
}

impl<T: DeserializeOwned> Reply<T> {
    /// The answer in typed form.
    pub fn parse(&self) -> Result<T, ApiError> {
        serde_json::from_str(&self.body).map_err(|e| ApiError::Decode {
            what: std::any::type_name::<T>()
                .rsplit("::")
                .next()
                .unwrap_or("answer"),
            reason: e.to_string(),
        })
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::Status {
                status,
                message,
                field,
                ..
            } => match field {
                Some(field) if !field.is_empty() && !message.starts_with(&format!("{field}:")) => {
                    write!(f, "{field}: {message} (HTTP {status})")
                }
                _ => write!(f, "{message} (HTTP {status})"),
            },
            ApiError::Unreachable { server, reason } => {
                write!(f, "cannot reach the registry at {server}: {reason}")
            }
            ApiError::Timeout { server, after } => write!(
                f,
                "the registry at {server} did not answer within {}",
                crate::args::format_duration(*after)
            ),
            ApiError::Transport { server, reason } => {
                write!(
                    f,
                    "lost the connection to the registry at {server}: {reason}"
                )
            }
            ApiError::Tls {
                server,
                reason,
                hint,
            } => {
                write!(f, "TLS with the registry at {server} failed: {reason}")?;
                if let Some(hint) = hint {
                    write!(f, "; {hint}")?;
                }
                Ok(())
            }
            ApiError::NotRegistry {
                server,
                detail,
                hint,
            } => {
                write!(
                    f,
                    "{server} does not look like a gangway registry ({detail})"
                )?;
                if let Some(hint) = hint {
                    write!(f, "; {hint}")?;
                }
                Ok(())
            }
            ApiError::Decode { what, reason } => {
                write!(f, "unexpected answer from the registry ({what}): {reason}")
            }
        }
    }
}

impl std::error::Error for ApiError {}

/// The error from a non-2xx answer, or the answer itself.
async fn check_status(
    server: &str,
    resp: reqwest::Response,
) -> Result<reqwest::Response, ApiError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let body = resp.text().await.unwrap_or_default();
    Err(status_error(
        server,
        status.as_u16(),
        status.canonical_reason(),
        &body,
    ))
}

/// The error of a non-2xx answer from `server`: an [`ApiError::Status`] when the body is
/// gangway's error JSON (or a 5xx, e.g. from a proxy in front of the registry), else
/// [`ApiError::NotRegistry`] (a 4xx or 501 any registry would explain in its own words).
pub fn status_error(server: &str, status: u16, reason: Option<&str>, body: &str) -> ApiError {
    match serde_json::from_str::<ErrorBody>(body) {
        Ok(ErrorBody { error }) => ApiError::Status {
            status,
            code: error.code,
            message: error.message,
            field: error.field,
        },
        Err(_) if (400..500).contains(&status) || status == 501 => ApiError::NotRegistry {
            server: server.to_owned(),
            detail: match reason {
                Some(reason) => format!("HTTP {status} {reason}"),
                None => format!("HTTP {status}"),
            },
            hint: None,
        },
        Err(_) => {
            let text = body.trim();
            let message = if text.is_empty() || text.len() > 200 || text.contains('\n') {
                reason.unwrap_or("request failed").to_owned()
            } else {
                text.to_owned()
            };
            ApiError::Status {
                status,
                code: None,
                message,
                field: None,
            }
        }
    }
}

/// The deepest `source()` of an error: the OS's reason rather than reqwest's wrapper text.
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

fn service_query(svc: &ServiceArgs) -> Vec<(&'static str, String)> {
    let mut q = Vec::new();
    if let Some(ns) = &svc.namespace {
        q.push(("namespace", ns.clone()));
    }
    if let Some(g) = &svc.group {
        q.push(("group", g.clone()));
    }
    q
}

fn instance_query(inst: &InstanceArgs) -> Vec<(&'static str, String)> {
    let mut q = service_query(&inst.service);
    if let Some(c) = &inst.cluster {
        q.push(("cluster", c.clone()));
    }
    q
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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

fn string_or_number<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Id {
        S(String),
        N(serde_json::Number),
    }
    Ok(match Id::deserialize(d)? {
        Id::S(s) => s,
        Id::N(n) => n.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_keeps_ipv4_and_encodes_brackets() {
        assert_eq!(segment("10.0.0.5:8080"), "10.0.0.5:8080");
        assert_eq!(segment("[::1]:80"), "%5B::1%5D:80");
        assert_eq!(segment("a b/c"), "a%20b%2Fc");
    }

    #[test]
    fn error_body_with_field_reads_as_one_line() {
        let body = r#"{"error":{"code":"invalid_argument","message":"must be 1-65535, got 0","field":"port"}}"#;
        let e = status_error("h:1", 400, Some("Bad Request"), body);
        assert_eq!(e.to_string(), "port: must be 1-65535, got 0 (HTTP 400)");
        assert!(matches!(e, ApiError::Status { status: 400, .. }));
    }

    #[test]
    fn error_message_already_naming_its_field_is_not_prefixed_twice() {
        let body = r#"{"error":{"code":"invalid_argument","message":"port: must be 1-65535, got 0","field":"port"}}"#;
        let e = status_error("h:1", 400, None, body);
        assert_eq!(e.to_string(), "port: must be 1-65535, got 0 (HTTP 400)");
    }

    #[test]
    fn foreign_5xx_bodies_fall_back_to_text_or_reason() {
        assert_eq!(
            status_error("h:1", 502, Some("Bad Gateway"), "").to_string(),
            "Bad Gateway (HTTP 502)"
        );
        assert_eq!(
            status_error("h:1", 503, Some("Service Unavailable"), "no upstream").to_string(),
            "no upstream (HTTP 503)"
        );
        let html = "<html>\n<body>oops</body>\n</html>";
        assert_eq!(
            status_error("h:1", 500, None, html).to_string(),
            "request failed (HTTP 500)"
        );
    }

    #[test]
    fn a_foreign_4xx_or_501_is_not_a_registry() {
        assert_eq!(
            status_error(
                "127.0.0.1:28850",
                404,
                Some("Not Found"),
                "404 page not found"
            )
            .to_string(),
            "127.0.0.1:28850 does not look like a gangway registry (HTTP 404 Not Found)"
        );
        assert_eq!(
            status_error("h:1", 501, Some("Not Implemented"), "").to_string(),
            "h:1 does not look like a gangway registry (HTTP 501 Not Implemented)"
        );
        // Gangway's own 404 stays a 404 with its message.
        let ours = r#"{"error":{"code":"not_found","message":"no instance","field":null}}"#;
        assert_eq!(
            status_error("h:1", 404, Some("Not Found"), ours).to_string(),
            "no instance (HTTP 404)"
        );
    }

    #[test]
    fn an_http2_only_answer_hints_at_the_grpc_port() {
        assert!(speaks_http2_only("invalid HTTP version parsed"));
        assert!(speaks_http2_only(
            "received unexpected message from connection"
        ));
        assert!(!speaks_http2_only("Connection refused (os error 111)"));
        let e = ApiError::NotRegistry {
            server: "127.0.0.1:9848".into(),
            detail: "invalid HTTP version parsed".into(),
            hint: Some(GRPC_PORT_HINT),
        };
        assert_eq!(
            e.to_string(),
            "127.0.0.1:9848 does not look like a gangway registry (invalid HTTP version \
             parsed); is this the gRPC port? the REST port is usually 8848 (a registry that \
             serves TLS needs https://)"
        );
    }

    #[test]
    fn subscriber_ids_may_be_numbers_or_strings() {
        let s: SubscriberAck =
            serde_json::from_str(r#"{"id":7,"address":"a","acked_revision":3}"#).unwrap();
        assert_eq!(s.id, "7");
        let s: SubscriberAck =
            serde_json::from_str(r#"{"id":"s-7","address":"a","acked_revision":3}"#).unwrap();
        assert_eq!(s.id, "s-7");
    }

    #[test]
    fn register_body_leaves_unset_fields_to_the_server() {
        let body = RegisterRequest {
            ip: "10.0.0.5".into(),
            port: 80,
            ephemeral: true,
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({"ip": "10.0.0.5", "port": 80, "ephemeral": true})
        );
    }

    #[test]
    fn a_bad_answer_is_a_decode_error() {
        let reply: Reply<Revision> = Reply {
            body: "{}".into(),
            kind: PhantomData,
        };
        let e = reply.parse().unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unexpected answer from the registry (Revision)"),
            "{e}"
        );
    }
}
