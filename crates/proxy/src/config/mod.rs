//! The proxy's typed configuration: start-up settings from flags and the TOML file (flags
//! win), and per-service pipeline settings from the file's `[defaults]` and `[services.NAME]`
//! tables. Built once per start and per reload; nothing is read from the environment later.
//!
//! Every problem of a file is reported at once, each naming its field
//! (`services.orders.retry.max_attempts: must be 1-10, got 0`); a file with any problem
//! changes nothing. The file format, every key and its default: `docs/proxy.md`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gangway_client::http::{
    BalancerKind, DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FIRST_VIEW_WAIT,
    DEFAULT_POOL_IDLE_TIMEOUT, HttpConfig,
};
use gangway_client::outlier::OutlierConfig;
use gangway_client::retry::RetryConfig;
use gangway_core::model::{DEFAULT_GROUP, DEFAULT_NAMESPACE, ServiceKey};
use http::Method;

use crate::naming;

mod file;

pub use file::ConfigError;

/// Default listener of the proxy: `127.0.0.1:15001`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:15001";
/// Default admin listener: `127.0.0.1:15002`.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:15002";
/// Default registry gRPC address: `127.0.0.1:9848`.
pub const DEFAULT_REGISTRY: &str = "127.0.0.1:9848";
/// Default largest request body, buffered so that a retry can replay it: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 1 << 20;
/// Largest accepted `max_request_body`: 64 MiB.
pub const MAX_MAX_REQUEST_BODY: usize = 64 << 20;
/// Default most services the proxy routes to at once (each is a registry subscription): 1024.
pub const DEFAULT_MAX_SERVICES: usize = 1024;
/// Largest accepted `max_services`: 65536.
pub const MAX_MAX_SERVICES: usize = 65_536;
/// Default most downstream connections open at once; more wait in the listen backlog: 10000.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Largest accepted `max_connections`: 1000000.
pub const MAX_MAX_CONNECTIONS: usize = 1_000_000;
/// Default longest wait for requests in flight after SIGTERM: 30 s.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper limit of every duration in the file: 24 h.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Everything the proxy runs with: start-up settings and the routing table.
///
/// Built by [`Config::load`]. A reload ([`Config::load`] again on SIGHUP) replaces the
/// routing part ([`Routing`]); the start-up part keeps the values the process started with.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Registry gRPC address (`registry`, flag `--registry`), or several nodes of one cluster
    /// separated by commas (`HOST:PORT,HOST:PORT`: the client fails over between them, in the
    /// order `gangway_client::ClientConfig::addresses` states). Default [`DEFAULT_REGISTRY`].
    pub registry: String,
    /// Proxy listener (`listen`, `--listen`). Default [`DEFAULT_LISTEN`].
    pub listen: SocketAddr,
    /// Admin listener; `None` turns it off (`admin = "off"`, `--admin off`). Default
    /// [`DEFAULT_ADMIN`].
    pub admin: Option<SocketAddr>,
    /// Most downstream connections at once (`max_connections`). Default
    /// [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// Longest wait for requests in flight after SIGTERM (`shutdown_timeout`). Default
    /// [`DEFAULT_SHUTDOWN_TIMEOUT`].
    pub shutdown_timeout: Duration,
    /// The file it was read from, if any.
    pub file: Option<PathBuf>,
    /// How requests are routed and with which pipeline settings (reloadable).
    pub routing: Arc<Routing>,
}

/// The reloadable part of the [`Config`]: naming defaults, limits, per-service settings.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Routing {
    /// Namespace of host names without one (`namespace`, `--namespace`). Default `public`.
    pub namespace: String,
    /// Group of host names without one (`group`, `--group`). Default `DEFAULT_GROUP`.
    pub group: String,
    /// Largest request body in bytes (`max_request_body`); larger requests get 413. Default
    /// [`DEFAULT_MAX_REQUEST_BODY`].
    pub max_request_body: usize,
    /// Most services routed to at once (`max_services`); requests for more get 503. Default
    /// [`DEFAULT_MAX_SERVICES`].
    pub max_services: usize,
    /// Settings of services that no `[services.NAME]` table names (`[defaults]`).
    pub defaults: Arc<ServiceSettings>,
    /// `[services.NAME]` tables by NAME, the host name that selects them.
    pub services: BTreeMap<String, Arc<ServiceEntry>>,
}

/// One `[services.NAME]` table, resolved.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ServiceEntry {
    /// The registry service the host name routes to.
    pub key: ServiceKey,
    /// Its settings: `[defaults]` overridden by the table.
    pub settings: Arc<ServiceSettings>,
}

/// Pipeline settings of one service; every default is the Rust client's (docs/client.md).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ServiceSettings {
    /// `balancer`: `round-robin` (default), `weighted`, `random`, `p2c`.
    pub balancer: BalancerKind,
    /// `[retry]`; `enabled = false` means one attempt. Default [`RetryConfig::default`].
    pub retry: RetryConfig,
    /// `idempotent_methods`: methods retried after a send failure or 502/503/504. Default the
    /// RFC 9110 set: GET, HEAD, PUT, DELETE, OPTIONS, TRACE.
    pub idempotent_methods: Vec<Method>,
    /// `[outlier]`; `None` when `enabled = false`. Default [`OutlierConfig::default`].
    pub outlier: Option<OutlierConfig>,
    /// `attempt_timeout`: one attempt's timeout when `retry.per_try_timeout` is unset.
    /// Default [`DEFAULT_ATTEMPT_TIMEOUT`] (10 s).
    pub attempt_timeout: Duration,
    /// `connect_timeout`: one TCP connect to an instance. Default [`DEFAULT_CONNECT_TIMEOUT`]
    /// (1 s).
    pub connect_timeout: Duration,
    /// `pool_idle_timeout`: idle keep-alive connections to instances close after this.
    /// Default [`DEFAULT_POOL_IDLE_TIMEOUT`] (30 s).
    pub pool_idle_timeout: Duration,
    /// `first_view_wait`: on a service's first request, the longest wait for its first
    /// instances. Default [`DEFAULT_FIRST_VIEW_WAIT`] (5 s).
    pub first_view_wait: Duration,
}

/// What the command line sets; each `Some` wins over the file.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Overrides {
    /// `--registry`.
    pub registry: Option<String>,
    /// `--listen`.
    pub listen: Option<SocketAddr>,
    /// `--admin` (`Some(None)`: off).
    pub admin: Option<Option<SocketAddr>>,
    /// `--namespace`.
    pub namespace: Option<String>,
    /// `--group`.
    pub group: Option<String>,
}

impl Default for ServiceSettings {
    fn default() -> Self {
        Self {
            balancer: BalancerKind::default(),
            retry: RetryConfig::default(),
            idempotent_methods: [
                Method::GET,
                Method::HEAD,
                Method::PUT,
                Method::DELETE,
                Method::OPTIONS,
                Method::TRACE,
            ]
            .into(),
            outlier: Some(OutlierConfig::default()),
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            pool_idle_timeout: DEFAULT_POOL_IDLE_TIMEOUT,
            first_view_wait: DEFAULT_FIRST_VIEW_WAIT,
        }
    }
}

impl ServiceSettings {
    /// The Rust client's settings for `key` with these values.
    ///
    /// Warm-up (slow start of new instances) is another issue's: once `HttpConfig` carries
    /// it, its `[services.NAME]` key is read in `file.rs` and set here, the one place where
    /// proxy settings become client settings.
    pub fn http_config(&self, key: &ServiceKey) -> HttpConfig {
        let mut config = HttpConfig::default()
            .with_balancer(self.balancer)
            .with_retry(self.retry.clone())
            .with_outlier(self.outlier.clone())
            .with_attempt_timeout(self.attempt_timeout)
            .with_pool_idle_timeout(self.pool_idle_timeout);
        config.namespace = key.namespace.clone();
        config.group = key.group.clone();
        config.connect_timeout = self.connect_timeout;
        config.first_view_wait = self.first_view_wait;
        config
    }

    /// Whether `method` may be retried after a send failure (see `idempotent_methods`).
    pub fn is_idempotent(&self, method: &Method) -> bool {
        self.idempotent_methods.contains(method)
    }
}

impl Routing {
    /// The service a host name routes to and its settings: a `[services.NAME]` table whose
    /// NAME is `host` first, else `host` read as `SERVICE[.GROUP[.NAMESPACE]]` (see
    /// [`naming::service_key`]) with the settings of the table for that service, if any, or
    /// `[defaults]`.
    ///
    /// # Errors
    /// The reason `host` names no service.
    pub fn route(&self, host: &str) -> Result<(ServiceKey, Arc<ServiceSettings>), String> {
        if let Some(entry) = self.services.get(host) {
            return Ok((entry.key.clone(), entry.settings.clone()));
        }
        let key = naming::service_key(host, &self.namespace, &self.group)?;
        let settings = self
            .services
            .values()
            .find(|e| e.key == key)
            .map_or_else(|| self.defaults.clone(), |e| e.settings.clone());
        Ok((key, settings))
    }
}

impl Config {
    /// Builds the config from `file` (if any) and the command line's `overrides`.
    ///
    /// # Errors
    /// [`ConfigError`]: the file cannot be read, is not TOML of the expected shape, or holds
    /// bad values (every one listed).
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        file::load(file, overrides)
    }

    /// The config of a proxy with no file: every default, then `overrides`.
    ///
    /// # Errors
    /// As [`Config::load`] (a bad `--namespace`, say).
    pub fn from_overrides(overrides: &Overrides) -> Result<Config, ConfigError> {
        file::load(None, overrides)
    }
}

/// Defaults of the naming part, shared by [`Routing`] and its tests.
pub(crate) fn default_names() -> (String, String) {
    (DEFAULT_NAMESPACE.to_owned(), DEFAULT_GROUP.to_owned())
}

#[cfg(test)]
mod tests;
