//! The data plane: one request in, the client crate's pipeline, one answer out.
//!
//! Per request: the host names the service ([`Routing::route`]); the service's
//! [`HttpClient`] (one per service, built with that service's settings) does balancing, retry
//! within the budget, outlier ejection, per-instance pools and the draining header; the
//! answer's head is returned as soon as it arrives and its body streams through. The request
//! body is read first (at most `max_request_body`), because a retry must be able to replay it.
//!
//! Hop-by-hop headers (RFC 9110 §7.6.1: `Connection` and the fields it names, `Keep-Alive`,
//! `Proxy-Connection`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`) and `Proxy-Authorization`
//! are not forwarded in either direction. `Host` is the request's authority when it has one
//! (absolute-form `GET http://orders/x`, HTTP/2's `:authority`; RFC 9112 §3.2.2), else the
//! client's `Host`; a request with two `Host` headers gets 400. Only `http` targets are
//! forwarded: an `https://` absolute-form target gets 400 `unsupported_scheme` (the proxy
//! neither tunnels nor originates TLS).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use bytes::Bytes;
use gangway_client::http::{
    AttemptMetrics, HttpClient, HttpRequest, RequestError, ServiceState, StreamingResponse,
};
use gangway_client::outlier::OutlierMetrics;
use gangway_client::{Client, Subscription};
use gangway_core::model::ServiceKey;
use gangway_core::view::View;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Limited};
use tokio::sync::watch;
use tokio::time::Instant;
use tower::BoxError;

use crate::config::{Routing, ServiceSettings};
use crate::error::ProxyError;
use crate::metrics::ProxyMetrics;
use crate::naming;

/// Response header with the number of attempts the answer took (1 = no retry).
pub const ATTEMPTS_HEADER: &str = "x-gangway-attempts";
/// Answers whose `Content-Length` is at most this are read whole before their head is sent,
/// so head and body leave in one write (a streamed small body costs a second write and a
/// second wake-up of the client); larger or chunked answers stream: 64 KiB.
pub const BUFFERED_ANSWER: u64 = 64 * 1024;

/// A request body must be read whole within this from the end of its head (a client that
/// trickles it gets 408 `request_timeout`, as the registry's `--http-body-timeout`): 10 s.
pub const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The body of every answer: an instance's, streamed, or the proxy's own JSON.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Where services are resolved.
pub enum Source {
    /// A registry session: services are subscribed on first use (and acked like any
    /// subscriber's).
    Registry(Client),
    /// Fixed view channels, for tests and embedding: other services are unknown.
    Views(Vec<(ServiceKey, watch::Receiver<Arc<View>>)>),
}

/// The proxy: routes requests to services through their pipelines. Cheap to clone.
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

struct Inner {
    source: Source,
    routing: RwLock<Arc<Routing>>,
    routes: RwLock<HashMap<ServiceKey, Arc<Route>>>,
    /// Subscriptions of the services the config names, held so that drains wait for this
    /// proxy before its first request to them.
    pinned: tokio::sync::Mutex<HashMap<ServiceKey, Subscription>>,
    metrics: ProxyMetrics,
    outlier_metrics: OutlierMetrics,
    attempt_metrics: AttemptMetrics,
}

/// One routed service: its pipeline and the settings it was built with.
pub(crate) struct Route {
    pub(crate) key: ServiceKey,
    pub(crate) settings: Arc<ServiceSettings>,
    pub(crate) http: HttpClient,
    /// `namespace/group/service`, the metrics label.
    pub(crate) label: String,
}

impl Proxy {
    /// A proxy over `source` with `routing`, counting into the given metrics (register them
    /// in one `prometheus_client` registry; see [`crate::metrics`]).
    pub fn new(
        source: Source,
        routing: Arc<Routing>,
        metrics: ProxyMetrics,
        outlier_metrics: OutlierMetrics,
        attempt_metrics: AttemptMetrics,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                source,
                routing: RwLock::new(routing),
                routes: RwLock::default(),
                pinned: tokio::sync::Mutex::default(),
                metrics,
                outlier_metrics,
                attempt_metrics,
            }),
        }
    }

    /// The routing in force.
    pub fn routing(&self) -> Arc<Routing> {
        self.inner
            .routing
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the routing (a reload). Services whose settings changed get a new pipeline on
    /// their next request (their outlier state and pools start afresh; requests in flight
    /// finish on the old one); the others keep theirs.
    pub fn set_routing(&self, routing: Arc<Routing>) {
        *self
            .inner
            .routing
            .write()
            .unwrap_or_else(PoisonError::into_inner) = routing;
    }

    /// Subscribes to every service the routing names (`[services.NAME]`), so that drains of
    /// their instances wait for this proxy from now on, and releases the subscriptions of
    /// services it no longer names. Failures are logged, not returned: the first request
    /// subscribes again. Waits at most the registry client's request timeout per service.
    pub async fn subscribe_configured(&self) {
        let Source::Registry(client) = &self.inner.source else {
            return;
        };
        let keys: Vec<ServiceKey> = self
            .routing()
            .services
            .values()
            .map(|e| e.key.clone())
            .collect();
        let mut pinned = self.inner.pinned.lock().await;
        pinned.retain(|k, _| keys.contains(k));
        for key in keys {
            if pinned.contains_key(&key) {
                continue;
            }
            match client.subscribe(key.clone()).await {
                Ok(s) => {
                    pinned.insert(key, s);
                }
                Err(e) => tracing::warn!(service = %key, error = %e, "cannot subscribe"),
            }
        }
    }

    /// The registry session is up (always true for [`Source::Views`]).
    pub fn is_connected(&self) -> bool {
        match &self.inner.source {
            Source::Registry(c) => c.is_connected(),
            Source::Views(_) => true,
        }
    }

    /// Why no request can be routed yet: the registry client never had a session (the proxy
    /// started before the registry). Once it had one, cached views serve through outages.
    fn no_registry_yet(&self) -> Option<String> {
        let Source::Registry(client) = &self.inner.source else {
            return None;
        };
        client.session().is_none().then(|| {
            format!(
                "no session with the registry at {} yet; retrying",
                client.config().address_list()
            )
        })
    }

    /// The registry client, when the source is one.
    pub fn registry(&self) -> Option<&Client> {
        match &self.inner.source {
            Source::Registry(c) => Some(c),
            Source::Views(_) => None,
        }
    }

    /// The metrics.
    pub(crate) fn metrics(&self) -> &ProxyMetrics {
        &self.inner.metrics
    }

    /// The attempt counters.
    pub(crate) fn attempt_metrics(&self) -> &AttemptMetrics {
        &self.inner.attempt_metrics
    }

    /// Every routed service, sorted.
    pub(crate) fn routes(&self) -> Vec<Arc<Route>> {
        let mut routes: Vec<Arc<Route>> = self
            .inner
            .routes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        routes.sort_by(|a, b| a.key.cmp(&b.key));
        routes
    }

    /// The routed service `key`, if a request used it.
    pub(crate) fn route_of(&self, key: &ServiceKey) -> Option<Arc<Route>> {
        self.inner
            .routes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// Answers one request. Never fails: errors are the proxy's own JSON answers
    /// ([`ProxyError`]).
    ///
    /// Cancellation: dropping the future (the client went away) abandons the attempt in
    /// flight.
    pub async fn handle<B>(&self, request: Request<B>) -> Response<ProxyBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let started = Instant::now();
        let (label, result) = match self.forward(request).await {
            Ok((route, response)) => (Some(route.label.clone()), Ok(response)),
            Err((route, e)) => (route.map(|r| r.label.clone()), Err(e)),
        };
        let label = label.unwrap_or_default();
        let response = match result {
            Ok(r) => r,
            Err(e) => {
                self.inner.metrics.error(&label, e.code());
                e.into_response()
            }
        };
        self.inner
            .metrics
            .request(&label, response.status().as_u16(), started.elapsed());
        response
    }

    async fn forward<B>(
        &self,
        request: Request<B>,
    ) -> Result<(Arc<Route>, Response<ProxyBody>), (Option<Arc<Route>>, ProxyError)>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        if request.method() == Method::CONNECT {
            return Err((
                None,
                ProxyError::MethodNotSupported {
                    method: request.method().to_string(),
                },
            ));
        }
        if let Some(scheme) = request.uri().scheme_str().filter(|s| *s != "http") {
            return Err((
                None,
                ProxyError::UnsupportedScheme {
                    scheme: scheme.to_owned(),
                },
            ));
        }
        let routing = self.routing();
        let host = naming::request_host(&request).map_err(|reason| (None, bad_host(reason)))?;
        let (key, settings) = routing
            .route(&host)
            .map_err(|reason| (None, bad_host(reason)))?;
        if let Some(reason) = self.no_registry_yet() {
            return Err((
                None,
                ProxyError::RegistryUnavailable {
                    service: key,
                    reason,
                },
            ));
        }
        let route = self
            .route(&key, &settings, &routing)
            .map_err(|e| (None, e))?;
        let fail = |e| (Some(route.clone()), e);
        let request = into_request(request, &route, routing.max_request_body)
            .await
            .map_err(fail)?;
        match route.http.send_streaming(request).await {
            Ok(answer) => match into_response(answer).await {
                Ok(response) => Ok((route.clone(), response)),
                Err(reason) => Err(fail(ProxyError::UpstreamFailed {
                    service: route.key.clone(),
                    reason,
                })),
            },
            Err(e) => Err(fail(self.request_error(&route, e))),
        }
    }

    /// The route of `key` with `settings`: the existing one, or a new pipeline when there is
    /// none or its settings changed.
    fn route(
        &self,
        key: &ServiceKey,
        settings: &Arc<ServiceSettings>,
        routing: &Routing,
    ) -> Result<Arc<Route>, ProxyError> {
        let current = |routes: &HashMap<ServiceKey, Arc<Route>>| {
            routes
                .get(key)
                .filter(|r| Arc::ptr_eq(&r.settings, settings) || *r.settings == **settings)
                .cloned()
        };
        if let Some(r) = current(
            &self
                .inner
                .routes
                .read()
                .unwrap_or_else(PoisonError::into_inner),
        ) {
            return Ok(r);
        }
        let mut routes = self
            .inner
            .routes
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = current(&routes) {
            return Ok(r);
        }
        if !routes.contains_key(key) && routes.len() >= routing.max_services {
            return Err(ProxyError::TooManyServices {
                service: key.clone(),
                limit: routing.max_services,
            });
        }
        let config = settings.http_config(key);
        let http = match &self.inner.source {
            Source::Registry(client) => HttpClient::new(client.clone(), config),
            Source::Views(views) => HttpClient::from_views(
                views.iter().filter(|(k, _)| k == key).cloned().collect(),
                config,
            ),
        }
        .map_err(|e| ProxyError::RegistryUnavailable {
            service: key.clone(),
            reason: e.to_string(),
        })?
        .with_outlier_metrics(self.inner.outlier_metrics.clone())
        .with_attempt_metrics(self.inner.attempt_metrics.clone());
        let route = Arc::new(Route {
            key: key.clone(),
            settings: settings.clone(),
            http,
            label: key.to_string(),
        });
        if routes.insert(key.clone(), route.clone()).is_some() {
            tracing::info!(service = %key, "settings changed: new pipeline");
        }
        Ok(route)
    }

    fn request_error(&self, route: &Route, e: RequestError) -> ProxyError {
        let service = route.key.clone();
        match e {
            RequestError::NoInstance { .. } => {
                let never_had_one = route
                    .http
                    .state(&route.key.service)
                    .is_none_or(|s| s.view.revision == 0 && s.view.instances.is_empty());
                if never_had_one {
                    ProxyError::UnknownService { service }
                } else {
                    ProxyError::NoInstance { service }
                }
            }
            // Only a view source without this service gets here without a registry.
            RequestError::Resolve { .. } if self.registry().is_none() => {
                ProxyError::UnknownService { service }
            }
            RequestError::Resolve { source, .. } => ProxyError::RegistryUnavailable {
                service,
                reason: source.to_string(),
            },
            other => ProxyError::UpstreamFailed {
                service,
                reason: other.to_string(),
            },
        }
    }
}

impl Route {
    /// The pipeline's state (`None` before the first request subscribed).
    pub(crate) fn state(&self) -> Option<ServiceState> {
        self.http.state(&self.key.service)
    }
}

fn bad_host(reason: String) -> ProxyError {
    ProxyError::BadHost { reason }
}

/// The client crate's request for `request`: URL naming the service, forwardable headers
/// (`Host` from the authority when the request has one), the body read (at most `limit`
/// bytes), idempotency from the service's settings.
async fn into_request<B>(
    request: Request<B>,
    route: &Route,
    limit: usize,
) -> Result<HttpRequest, ProxyError>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, Limited::new(body, limit).collect());
    let body = read
        .await
        .map_err(|_| ProxyError::BodyTimeout {
            after_ms: BODY_READ_TIMEOUT.as_millis() as u64,
        })?
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                ProxyError::BodyTooLarge { limit }
            } else {
                ProxyError::BadRequestBody {
                    reason: e.to_string(),
                }
            }
        })?
        .to_bytes();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers);
    headers.remove(header::PROXY_AUTHORIZATION);
    // The body is read already: the instance must not wait for a 100-continue.
    headers.remove(header::EXPECT);
    if let Some(authority) = parts.uri.authority()
        && let Ok(value) = HeaderValue::from_str(authority.as_str())
    {
        headers.insert(header::HOST, value);
    }
    Ok(HttpRequest {
        idempotent: Some(route.settings.is_idempotent(&parts.method)),
        method: parts.method,
        url: format!("http://{}{path}", route.key.service),
        headers,
        body,
    })
}

/// The answer for the client; a small body is read first (see [`BUFFERED_ANSWER`]).
///
/// # Errors
/// The transport's message when a small body broke off (the head is not sent yet, so the
/// client gets a 502 instead of a truncated answer).
async fn into_response(answer: StreamingResponse) -> Result<Response<ProxyBody>, String> {
    let attempts = answer.attempts;
    let small = answer
        .body
        .size_hint()
        .exact()
        .is_some_and(|n| n <= BUFFERED_ANSWER);
    let body = if small {
        let bytes = answer
            .body
            .collect()
            .await
            .map_err(|e| format!("the answer's body broke off: {e}"))?
            .to_bytes();
        http_body_util::Full::new(bytes)
            .map_err(|never| match never {})
            .boxed_unsync()
    } else {
        answer.body.boxed_unsync()
    };
    let mut response = Response::new(body);
    *response.status_mut() = answer.status;
    let mut headers = answer.headers;
    strip_hop_by_hop(&mut headers);
    headers.insert(ATTEMPTS_HEADER, HeaderValue::from(attempts));
    *response.headers_mut() = headers;
    Ok(response)
}

/// Removes the hop-by-hop fields: those `Connection` names, then the fixed set.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests;
