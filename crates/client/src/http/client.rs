//! The HTTP client and its request loop.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_core::view::View;
use http::{HeaderMap, Method, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use super::config::HttpConfig;
use super::error::RequestError;
use super::metrics::AttemptMetrics;
use super::target::Target;
use crate::Client;
use crate::balance::pickable;
use crate::outlier::{EjectionInfo, Outcome, OutlierMetrics};
use crate::retry::{BudgetStats, Failure, is_idempotent, may_retry};

/// Response header by which a draining instance says so in band (DESIGN §4).
pub const DRAINING_HEADER: &str = "x-gangway-draining";

/// A request to a service: `url` names the service as its host, `http://orders/path?q`.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    /// Method.
    pub method: Method,
    /// `http://<service>/<path>`.
    pub url: String,
    /// Headers sent as they are.
    pub headers: HeaderMap,
    /// Body (cloned per attempt, cheap).
    pub body: Bytes,
    /// Overrides the method's idempotency (RFC 9110) for retry decisions.
    pub idempotent: Option<bool>,
}

impl HttpRequest {
    /// A request with no headers and no body.
    pub fn new(method: Method, url: impl Into<String>) -> Self {
        Self {
            method,
            url: url.into(),
            headers: HeaderMap::new(),
            body: Bytes::new(),
            idempotent: None,
        }
    }

    /// Marks the request idempotent (retried after a send failure or 502/503/504) or not.
    pub fn idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = Some(idempotent);
        self
    }

    /// With this body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }
}

/// An answer, whatever its status.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
    /// Attempts it took (1 = no retry).
    pub attempts: u32,
    /// Instance that answered.
    pub instance: InstanceKey,
}

/// An answer whose body may still be arriving, from [`HttpClient::send_streaming`].
#[derive(Debug)]
#[non_exhaustive]
pub struct StreamingResponse {
    /// Status.
    pub status: StatusCode,
    /// Headers, as the instance sent them.
    pub headers: HeaderMap,
    /// The body, read as it arrives.
    pub body: ResponseBody,
    /// Attempts it took (1 = no retry).
    pub attempts: u32,
    /// Instance that answered.
    pub instance: InstanceKey,
}

/// The body of a [`StreamingResponse`]: an [`http_body::Body`] of `Bytes` frames read from
/// the instance's connection (the connection returns to the pool once it is read to the end).
///
/// The attempt's timeout ([`HttpConfig::per_try_timeout`]) covers the body too: a body still
/// arriving when it passes ends with an error. Errors are boxed transport errors; no frame
/// follows one. Dropping the body early closes that connection instead of reusing it.
pub struct ResponseBody {
    inner: reqwest::Body,
}

/// A snapshot of one service's pipeline, from [`HttpClient::state`]: what an admin endpoint
/// shows.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServiceState {
    /// The service.
    pub service: ServiceKey,
    /// Its current view (revision 0 with no instance: the registry has never had one).
    pub view: Arc<View>,
    /// Instances ejected by outlier detection right now, and why (empty when ejection is off).
    pub ejected: Vec<(InstanceKey, EjectionInfo)>,
    /// Instances skipped because they answered with the draining header (at most
    /// [`DRAINING_HOLD`](super::DRAINING_HOLD) each, unless the view drops them
    /// first).
    pub draining: Vec<InstanceKey>,
    /// Instances holding a connection pool.
    pub pooled: Vec<InstanceKey>,
    /// The service's retry budget: requests, granted and refused retries so far.
    pub budget: BudgetStats,
}

/// Resolves services through a registry [`Client`] and sends requests through the pipeline.
/// Cheap to clone.
#[derive(Clone)]
pub struct HttpClient {
    /// Where services are resolved; `None` for a client over fixed view sources only.
    registry: Option<Client>,
    config: HttpConfig,
    metrics: Option<OutlierMetrics>,
    attempt_metrics: Option<AttemptMetrics>,
    /// Services in use. Read on every request (a short `std` lock, never held across an
    /// await); written only when a service is first used.
    targets: Arc<RwLock<HashMap<String, Arc<Target>>>>,
    /// Held while a service is first used (subscribe + wait for its first view), so two
    /// requests never subscribe twice; requests to services in use never wait for it.
    resolving: Arc<tokio::sync::Mutex<()>>,
    /// The view channels of [`from_views`](Self::from_views), by service name.
    views: Arc<HashMap<String, ViewSource>>,
}

type ViewSource = (ServiceKey, tokio::sync::watch::Receiver<Arc<View>>);

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("config", &self.config)
            .finish()
    }
}

enum Attempt {
    Answered(reqwest::Response),
    Failed(Failure, String),
}

impl HttpClient {
    /// A client over `registry`'s subscriptions.
    ///
    /// # Errors
    /// [`crate::Error::InvalidConfig`] listing every problem of `config.retry` and
    /// `config.outlier`.
    pub fn new(registry: Client, config: HttpConfig) -> Result<Self, crate::Error> {
        Self::check(&config)?;
        Ok(Self {
            registry: Some(registry),
            config,
            metrics: None,
            attempt_metrics: None,
            targets: Arc::default(),
            resolving: Arc::default(),
            views: Arc::default(),
        })
    }

    /// A client over views that come from elsewhere (for example a poller of another
    /// registry, or a fixed list in tests): `views` maps each service name to its view channel.
    /// URLs naming other services fail with [`RequestError::Resolve`]. Each service's pipeline
    /// is built on its first request, as with a registry, so metrics set afterwards with
    /// [`with_outlier_metrics`](Self::with_outlier_metrics) count it.
    ///
    /// # Errors
    /// As [`HttpClient::new`].
    pub fn from_views(
        views: Vec<(
            ServiceKey,
            tokio::sync::watch::Receiver<Arc<gangway_core::View>>,
        )>,
        config: HttpConfig,
    ) -> Result<Self, crate::Error> {
        Self::check(&config)?;
        let views = views
            .into_iter()
            .map(|(key, rx)| (key.service.clone(), (key, rx)))
            .collect();
        Ok(Self {
            registry: None,
            config,
            metrics: None,
            attempt_metrics: None,
            targets: Arc::default(),
            resolving: Arc::default(),
            views: Arc::new(views),
        })
    }

    fn check(config: &HttpConfig) -> Result<(), crate::Error> {
        let mut problems = config.retry.problems();
        if let Some(w) = &config.warm_up {
            problems.extend(w.problems());
        }
        if let Some(Err(crate::Error::InvalidConfig { problems: more })) =
            config.outlier.as_ref().map(|o| o.validate())
        {
            problems.extend(more);
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(crate::Error::InvalidConfig { problems })
        }
    }

    /// Counts ejections and recoveries of every service in `metrics` (register it with
    /// [`OutlierMetrics::register`]). Applies to services first used after this call.
    pub fn with_outlier_metrics(mut self, metrics: OutlierMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Counts every attempt in `metrics` by service, instance and outcome (register it with
    /// [`AttemptMetrics::register`]). Applies to every request sent after this call.
    pub fn with_attempt_metrics(mut self, metrics: AttemptMetrics) -> Self {
        self.attempt_metrics = Some(metrics);
        self
    }

    /// The settings.
    pub fn config(&self) -> &HttpConfig {
        &self.config
    }

    /// GET `url` (`http://<service>/path`).
    ///
    /// # Errors
    /// See [`HttpClient::send`].
    pub async fn get(&self, url: &str) -> Result<HttpResponse, RequestError> {
        self.send(HttpRequest::new(Method::GET, url)).await
    }

    /// Sends `request` through the pipeline and reads the whole answer. An answer with any
    /// status is `Ok` (after retrying 502/503/504 for idempotent requests).
    ///
    /// # Errors
    /// [`RequestError::InvalidUrl`], [`RequestError::Resolve`] (first use of a service, the
    /// registry unreachable), [`RequestError::NoInstance`], [`RequestError::Failed`] (the last
    /// attempt got no answer, or its body broke off).
    pub async fn send(&self, request: HttpRequest) -> Result<HttpResponse, RequestError> {
        let answer = self.send_streaming(request).await?;
        let StreamingResponse {
            status,
            headers,
            body,
            attempts,
            instance,
        } = answer;
        match body.collect().await {
            Ok(body) => Ok(HttpResponse {
                status,
                headers,
                body: body.to_bytes(),
                attempts,
                instance,
            }),
            Err(e) => Err(RequestError::Failed {
                failure: Failure::AfterSend,
                attempts,
                instance,
                message: chain(&*e),
            }),
        }
    }

    /// Sends `request` through the pipeline like [`send`](Self::send), but returns as soon as
    /// the answer's head arrived: the body streams from the instance (for proxies, and large
    /// answers). Retry and outlier decisions are taken on the head, as in `send`; a body that
    /// breaks off later is an error of the body, never retried.
    ///
    /// Cancellation: dropping the future abandons the attempt in flight (its connection is
    /// closed, its outcome not recorded).
    ///
    /// # Errors
    /// As [`send`](Self::send), except that body errors come from the [`ResponseBody`].
    pub async fn send_streaming(
        &self,
        request: HttpRequest,
    ) -> Result<StreamingResponse, RequestError> {
        let (service, path) = split_url(&request.url)?;
        let target = self.target(&service).await?;
        let idempotent = request
            .idempotent
            .unwrap_or_else(|| is_idempotent(&request.method));
        let max_attempts = self.config.retry.max_attempts.max(1);
        target.budget.deposit();
        let mut tried: Vec<InstanceKey> = Vec::new();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let view = target.views.borrow().clone();
            let candidates = target.candidates(&view, &tried);
            let Some(instance) = target.balancer.pick_from(&candidates) else {
                return Err(RequestError::NoInstance { service });
            };
            let key = instance.key.clone();
            target.balancer.started(&key);
            let attempt = self.attempt(&target, &key, &request, &path).await;
            target.balancer.finished(&key);
            let failure = match &attempt {
                Attempt::Answered(r) if r.status().is_server_error() => {
                    Some(Failure::Status(r.status().as_u16()))
                }
                Attempt::Answered(_) => None,
                Attempt::Failed(f, _) => Some(*f),
            };
            let outcome = match failure {
                None => Outcome::Success,
                Some(Failure::Connect) => Outcome::ConnectFailure,
                Some(Failure::AfterSend) => Outcome::NetworkError,
                Some(Failure::Status(_)) => Outcome::ServerError,
            };
            if let Some(m) = &self.attempt_metrics {
                m.record(&target.name, &key, outcome);
            }
            if let Some(d) = &target.detector {
                d.record(&key, outcome, pickable(&view).len());
                if d.is_ejected(&key) {
                    target.drop_pool(&key);
                }
            }
            let retry = failure.is_some_and(|f| {
                attempts < max_attempts && may_retry(f, idempotent) && target.budget.withdraw()
            });
            if retry {
                tried.push(key);
                continue;
            }
            return match attempt {
                Attempt::Answered(r) => Ok(Self::answer(&target, key, r, attempts)),
                Attempt::Failed(failure, message) => Err(RequestError::Failed {
                    failure,
                    attempts,
                    instance: key,
                    message,
                }),
            };
        }
    }

    async fn attempt(
        &self,
        target: &Target,
        key: &InstanceKey,
        request: &HttpRequest,
        path: &str,
    ) -> Attempt {
        let url = format!("http://{}{path}", key.addr());
        let sent = target
            .pool(key)
            .request(request.method.clone(), url)
            .headers(request.headers.clone())
            .body(request.body.clone())
            .timeout(self.config.per_try_timeout())
            .send()
            .await;
        match sent {
            Ok(r) => Attempt::Answered(r),
            Err(e) => Attempt::Failed(classify(&e), chain(&e)),
        }
    }

    fn answer(
        target: &Target,
        instance: InstanceKey,
        r: reqwest::Response,
        attempts: u32,
    ) -> StreamingResponse {
        if r.headers().contains_key(DRAINING_HEADER) {
            target.mark_draining(&instance);
        }
        let (head, body) = http::Response::from(r).into_parts();
        StreamingResponse {
            status: head.status,
            headers: head.headers,
            body: ResponseBody { inner: body },
            attempts,
            instance,
        }
    }

    fn known(&self, service: &str) -> Option<Arc<Target>> {
        self.targets
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(service)
            .cloned()
    }

    async fn target(&self, service: &str) -> Result<Arc<Target>, RequestError> {
        if let Some(t) = self.known(service) {
            return Ok(t);
        }
        let _resolving = self.resolving.lock().await;
        // Another request may have resolved it while this one waited.
        if let Some(t) = self.known(service) {
            return Ok(t);
        }
        let key = ServiceKey::new(&self.config.namespace, &self.config.group, service);
        let resolve = |source| RequestError::Resolve {
            service: service.to_owned(),
            source,
        };
        let Some(registry) = self.registry.as_ref() else {
            let (key, rx) = self
                .views
                .get(service)
                .cloned()
                .ok_or_else(|| resolve(crate::Error::Closed))?;
            let target =
                Target::new(key, rx, None, &self.config, self.metrics.as_ref()).map_err(resolve)?;
            self.targets
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(service.to_owned(), target.clone());
            return Ok(target);
        };
        let mut subscription = registry.subscribe(key).await.map_err(resolve)?;
        // A first request should not fail only because the first push is on its way.
        let _ = subscription
            .wait_for(|v| !v.instances.is_empty(), self.config.first_view_wait)
            .await;
        let views = subscription.receiver();
        let key = subscription.service().clone();
        let target = Target::new(
            key,
            views,
            Some(subscription),
            &self.config,
            self.metrics.as_ref(),
        )
        .map_err(resolve)?;
        self.targets
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(service.to_owned(), target.clone());
        Ok(target)
    }

    /// The pipeline state of `service` (a name as in URLs), or `None` when no request used it
    /// yet. Never waits for the registry.
    pub fn state(&self, service: &str) -> Option<ServiceState> {
        self.known(service).map(|t| t.state())
    }

    /// The pipeline state of every service used so far, sorted by service.
    pub fn states(&self) -> Vec<ServiceState> {
        let targets: Vec<Arc<Target>> = self
            .targets
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        let mut states: Vec<ServiceState> = targets.iter().map(|t| t.state()).collect();
        states.sort_by(|a, b| a.service.cmp(&b.service));
        states
    }

    /// Instances of `service` that hold a connection pool right now (diagnostics, tests).
    pub async fn pooled(&self, service: &str) -> Vec<InstanceKey> {
        self.known(service).map(|t| t.pooled()).unwrap_or_default()
    }

    /// Instances of `service` ejected right now.
    pub async fn ejected(&self, service: &str) -> Vec<InstanceKey> {
        let Some(t) = self.known(service) else {
            return Vec::new();
        };
        t.detector
            .as_ref()
            .map(|d| d.ejected().into_iter().map(|(k, _)| k).collect())
            .unwrap_or_default()
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = tower::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner)
            .poll_frame(cx)
            .map_err(tower::BoxError::from)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody")
            .field("size_hint", &self.inner.size_hint())
            .finish()
    }
}

/// `http://service/path?q` -> ("service", "/path?q").
fn split_url(url: &str) -> Result<(String, String), RequestError> {
    let invalid = |reason: &str| RequestError::InvalidUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: Uri = url.parse().map_err(|_| invalid("not a URL"))?;
    if uri.scheme_str() != Some("http") {
        return Err(invalid("the scheme must be http"));
    }
    let host = uri
        .host()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| invalid("no service name as host"))?;
    gangway_core::validate::name("service", host).map_err(|e| invalid(&e.message))?;
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let path = if path.is_empty() { "/" } else { path };
    Ok((host.to_owned(), path.to_owned()))
}

/// Connect-phase failures never reached the application.
fn classify(e: &reqwest::Error) -> Failure {
    if e.is_connect() {
        Failure::Connect
    } else {
        Failure::AfterSend
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_the_service_as_host() {
        assert_eq!(
            split_url("http://orders/a/b?x=1").unwrap(),
            ("orders".into(), "/a/b?x=1".into())
        );
        assert_eq!(
            split_url("http://orders").unwrap(),
            ("orders".into(), "/".into())
        );
        for bad in [
            "https://orders/",
            "orders/x",
            "http:///x",
            "http://bad name/",
        ] {
            assert!(
                matches!(split_url(bad), Err(RequestError::InvalidUrl { .. })),
                "{bad}"
            );
        }
    }
}
