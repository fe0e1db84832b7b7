//! Nacos wire compatibility (docs/compat.md): the v1 naming HTTP Open API and the v3 client and
//! admin instance paths on the HTTP port ([`http`]), and the Nacos 2.x/3.x SDK gRPC protocol on
//! the gRPC port ([`grpc`]). Both sit on the same [`Registry`] as the native APIs: an instance
//! registered by a Nacos client is a gangway instance, a Nacos subscriber is a gangway
//! subscriber (acks included), and a drain waits for Nacos consumers like any other.
//!
//! ```no_run
//! # async fn demo(registry: gangway_server::Registry) {
//! let nacos = gangway_server::nacos::Nacos::new(registry);
//! let router = gangway_server::nacos::http::router(nacos.clone());
//! let (request, bi_stream) = gangway_server::nacos::grpc::services(nacos);
//! # let _ = (router, request, bi_stream);
//! # }
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gangway_core::model::ServiceKey;

use crate::engine::Registry;

pub mod grpc;
pub mod http;
pub mod model;

use model::{ServiceInfo, cluster_list, grouped, nacos_instance, select};

/// Prefix of the `client_name` of every subscriber that came through a Nacos protocol; the
/// drain uses it to warn that Nacos SDKs ignore empty instance lists.
pub const CLIENT_NAME_PREFIX: &str = "nacos";

/// The Nacos layer's shared state: the registry, the per-service `lastRefTime` clock and the
/// gRPC connections. Cheap to clone.
#[derive(Clone)]
pub struct Nacos {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    /// The push `serviceInfo` of each (service, cluster filter), as JSON, for the revision it
    /// was built at: every subscriber pushed that revision shares it.
    pushes: Mutex<HashMap<(ServiceKey, String), Arc<PushInfo>>>,
    /// Last `lastRefTime` handed out per service.
    ref_times: Mutex<HashMap<ServiceKey, u64>>,
    /// gRPC connections by transport (peer address): unary calls and the stream share it.
    conns: Mutex<HashMap<SocketAddr, Arc<grpc::Conn>>>,
    next_id: AtomicU64,
    /// Set once the server stops: every connection stream ends.
    closing: tokio::sync::watch::Sender<bool>,
    /// Client detection: a connection silent this long gets a `ClientDetectionRequest`...
    detect_after: Duration,
    /// ...and is closed when it does not answer within this.
    detect_timeout: Duration,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Nacos {
    /// The Nacos layer over `registry`, with the registry configuration's client detection
    /// timing ([`Config::nacos`](crate::Config::nacos)).
    pub fn new(registry: Registry) -> Self {
        let timing = registry.config().nacos;
        Self::with_detection(registry, timing.detect_after, timing.detect_timeout)
    }

    /// The Nacos layer with its own client detection timing: a gRPC connection that sent
    /// nothing for `after` is probed with a `ClientDetectionRequest` and closed (its instances
    /// go) when no answer comes within `timeout`.
    pub fn with_detection(registry: Registry, after: Duration, timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                registry,
                pushes: Mutex::new(HashMap::new()),
                ref_times: Mutex::new(HashMap::new()),
                conns: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                closing: tokio::sync::watch::channel(false).0,
                detect_after: after,
                detect_timeout: timeout,
            }),
        }
    }

    /// The registry behind it.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    fn conns(&self) -> MutexGuard<'_, HashMap<SocketAddr, Arc<grpc::Conn>>> {
        self.inner
            .conns
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A `lastRefTime` for `service`: the wall clock in ms, but always greater than any value
    /// handed out before for the same service (SDKs drop data whose value did not grow).
    pub fn ref_time(&self, service: &ServiceKey) -> u64 {
        let mut times = self
            .inner
            .ref_times
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let last = times.entry(service.clone()).or_insert(0);
        *last = now_ms().max(*last + 1);
        *last
    }

    /// The ServiceInfo a Nacos client gets for `service` now, and the registry revision it was
    /// read at. `grouped_name`: v1 answers `group@@svc` in `name`, gRPC the bare name.
    pub fn service_info(
        &self,
        service: &ServiceKey,
        clusters: &str,
        healthy_only: bool,
        grouped_name: bool,
    ) -> (u64, ServiceInfo) {
        let registry = self.registry();
        let threshold = registry
            .settings(service)
            .map(|s| s.protect_threshold)
            .unwrap_or(0.0);
        let (revision, entries) = registry.entries(service);
        let wanted = cluster_list(clusters);
        let (picked, reach) = select(&entries, &wanted, healthy_only, threshold);
        let hosts = picked
            .into_iter()
            .map(|e| nacos_instance(service, e, reach))
            .collect();
        let info = ServiceInfo {
            name: if grouped_name {
                grouped(service)
            } else {
                service.service.clone()
            },
            group_name: service.group.clone(),
            clusters: clusters.to_owned(),
            cache_millis: model::CACHE_MILLIS,
            hosts,
            last_ref_time: self.ref_time(service),
            checksum: "",
            all_ips_2x: false,
            all_ips: false,
            reach_protection_threshold: reach,
            valid: true,
        };
        (revision, info)
    }
}

/// The `serviceInfo` of a push, built once per revision and cluster filter.
#[derive(Debug)]
pub struct PushInfo {
    /// The registry revision it was read at.
    pub revision: u64,
    /// `serviceInfo` as JSON.
    pub json: String,
}

impl Nacos {
    /// The `serviceInfo` pushed to subscribers of `service` with cluster filter `clusters`
    /// (all instances, gRPC naming): built when the service's revision moved since the last
    /// call, otherwise shared. A subscriber acks the returned revision.
    pub fn push_info(&self, service: &ServiceKey, clusters: &str) -> Arc<PushInfo> {
        let current = self.registry().revision(service);
        let key = (service.clone(), clusters.to_owned());
        if let Some(info) = self.lock_pushes().get(&key) {
            if info.revision == current {
                return info.clone();
            }
        }
        let (revision, info) = self.service_info(service, clusters, false, false);
        let built = Arc::new(PushInfo {
            revision,
            json: serde_json::to_string(&info).expect("ServiceInfo serialises"),
        });
        let mut cache = self.lock_pushes();
        let keep = cache
            .get(&key)
            .is_none_or(|cached| cached.revision <= revision);
        if keep {
            cache.insert(key, built.clone());
        }
        built
    }

    fn lock_pushes(&self) -> MutexGuard<'_, HashMap<(ServiceKey, String), Arc<PushInfo>>> {
        self.inner
            .pushes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests;
