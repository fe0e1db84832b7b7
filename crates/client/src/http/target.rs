//! Per-service state of the HTTP client: subscription, balancer, budget, outlier detector and
//! one connection pool per instance.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use gangway_core::view::View;
use tokio::sync::watch;
use tokio::time::Instant;

use super::client::ServiceState;
use super::config::{DRAINING_HOLD, HttpConfig};
use crate::Subscription;
use crate::balance::{Balancer, pickable};
use crate::outlier::{OutlierDetector, OutlierMetrics, RecoveryCheck};
use crate::retry::RetryBudget;

pub(crate) struct Target {
    /// The service, and as `namespace/group/service` text for metric labels.
    service: ServiceKey,
    pub(crate) name: String,
    /// The service's view, from a subscription or any other source.
    pub(crate) views: watch::Receiver<Arc<View>>,
    /// Keeps the registry subscription alive (None for other view sources).
    _subscription: Option<Subscription>,
    pub(crate) balancer: Box<dyn Balancer>,
    pub(crate) budget: RetryBudget,
    pub(crate) detector: Option<Arc<OutlierDetector>>,
    pools: Mutex<HashMap<InstanceKey, reqwest::Client>>,
    draining: Mutex<HashMap<InstanceKey, Instant>>,
    config: HttpConfig,
    watcher: tokio::task::AbortHandle,
}

impl Drop for Target {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

/// How often due TCP recovery checks are looked for.
const TCP_CHECK_TICK: std::time::Duration = std::time::Duration::from_millis(100);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Target {
    /// Errors: an invalid outlier config (checked before in [`HttpClient::new`](super::HttpClient::new)).
    pub(crate) fn new(
        service: ServiceKey,
        views: watch::Receiver<Arc<View>>,
        subscription: Option<Subscription>,
        config: &HttpConfig,
        metrics: Option<&OutlierMetrics>,
    ) -> Result<Arc<Self>, crate::Error> {
        let detector = match config.outlier.clone() {
            Some(c) => {
                let d = OutlierDetector::new(service.clone(), c)?;
                Some(Arc::new(match metrics {
                    Some(m) => d.with_metrics(m.clone()),
                    None => d,
                }))
            }
            None => None,
        };
        let tcp_checks = config
            .outlier
            .as_ref()
            .is_some_and(|o| o.check == RecoveryCheck::TcpConnect);
        let balancer = config.balancer.build_with(config.warm_up)?;
        Ok(Arc::new_cyclic(|weak: &std::sync::Weak<Target>| {
            let weak = weak.clone();
            let mut rx = views.clone();
            // Follows the view: instances that leave it lose their pool (idle connections
            // close, none is reused), their draining mark and their outlier state.
            // With TCP recovery checks it also connects to ejected instances whose check is due.
            let watcher = tokio::spawn(async move {
                let mut tick = tokio::time::interval(TCP_CHECK_TICK);
                loop {
                    tokio::select! {
                        changed = rx.changed() => {
                            if changed.is_err() {
                                break;
                            }
                            let view = rx.borrow_and_update().clone();
                            let Some(target) = weak.upgrade() else { break };
                            target.forget_missing(&view);
                        }
                        _ = tick.tick(), if tcp_checks => {
                            let Some(target) = weak.upgrade() else { break };
                            target.run_tcp_checks();
                        }
                    }
                }
            })
            .abort_handle();
            Target {
                name: service.to_string(),
                service,
                balancer,
                budget: RetryBudget::new(&config.retry),
                detector,
                views,
                _subscription: subscription,
                pools: Mutex::new(HashMap::new()),
                draining: Mutex::new(HashMap::new()),
                config: config.clone(),
                watcher,
            }
        }))
    }

    fn run_tcp_checks(&self) {
        let Some(detector) = &self.detector else {
            return;
        };
        for instance in detector.due_tcp_checks() {
            let detector = detector.clone();
            let timeout = self.config.connect_timeout;
            tokio::spawn(async move {
                let connect = tokio::net::TcpStream::connect(instance.addr());
                let ok = matches!(tokio::time::timeout(timeout, connect).await, Ok(Ok(_)));
                detector.check_result(&instance, ok);
            });
        }
    }

    fn forget_missing(&self, view: &View) {
        let live: Vec<InstanceKey> = view.instances.iter().map(|i| i.key.clone()).collect();
        lock(&self.pools).retain(|k, _| live.contains(k));
        lock(&self.draining).retain(|k, _| live.contains(k));
        if let Some(d) = &self.detector {
            d.retain(&live);
        }
    }

    /// Candidates for the next attempt: pickable, not draining, admitted by the outlier
    /// detector, then not tried yet (unless nothing else is left).
    pub(crate) fn candidates<'a>(
        &self,
        view: &'a View,
        tried: &[InstanceKey],
    ) -> Vec<&'a Instance> {
        let now = Instant::now();
        let draining = {
            let mut d = lock(&self.draining);
            d.retain(|_, since| now.duration_since(*since) < DRAINING_HOLD);
            d.keys().cloned().collect::<Vec<_>>()
        };
        let all: Vec<&Instance> = pickable(view)
            .into_iter()
            .filter(|i| !draining.contains(&i.key))
            .collect();
        let admitted = match &self.detector {
            Some(d) => d.admit(all),
            None => all,
        };
        let fresh: Vec<&Instance> = admitted
            .iter()
            .copied()
            .filter(|i| !tried.contains(&i.key))
            .collect();
        if fresh.is_empty() { admitted } else { fresh }
    }

    /// The pooled client of an instance, created on first use.
    pub(crate) fn pool(&self, instance: &InstanceKey) -> reqwest::Client {
        lock(&self.pools)
            .entry(instance.clone())
            .or_insert_with(|| {
                reqwest::Client::builder()
                    .pool_idle_timeout(self.config.pool_idle_timeout)
                    .connect_timeout(self.config.connect_timeout)
                    // Instances are reached directly: an `http_proxy` in the environment
                    // (set for the applications behind `gangway proxy`, say) must not
                    // route instance traffic, least of all back into that proxy.
                    .no_proxy()
                    .build()
                    .unwrap_or_default()
            })
            .clone()
    }

    /// Drops an instance's pool: its idle connections close once no request holds them.
    pub(crate) fn drop_pool(&self, instance: &InstanceKey) {
        lock(&self.pools).remove(instance);
    }

    /// The instance said it is draining: skip it and drop its connections.
    pub(crate) fn mark_draining(&self, instance: &InstanceKey) {
        lock(&self.draining).insert(instance.clone(), Instant::now());
        self.drop_pool(instance);
    }

    /// The state shown by [`HttpClient::state`](super::HttpClient::state).
    pub(crate) fn state(&self) -> ServiceState {
        let now = Instant::now();
        let mut draining: Vec<InstanceKey> = lock(&self.draining)
            .iter()
            .filter(|(_, since)| now.duration_since(**since) < DRAINING_HOLD)
            .map(|(k, _)| k.clone())
            .collect();
        draining.sort();
        let mut pooled = self.pooled();
        pooled.sort();
        ServiceState {
            service: self.service.clone(),
            view: self.views.borrow().clone(),
            ejected: self
                .detector
                .as_ref()
                .map(|d| d.ejected())
                .unwrap_or_default(),
            draining,
            pooled,
            budget: self.budget.stats(),
        }
    }

    /// Instances with a pool right now (for tests and diagnostics).
    pub(crate) fn pooled(&self) -> Vec<InstanceKey> {
        lock(&self.pools).keys().cloned().collect()
    }
}
