//! The TOML file as written, and its resolution into a [`Config`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gangway_client::http::BalancerKind;
use gangway_client::outlier::{ErrorKinds, RecoveryCheck};
use gangway_core::model::ServiceKey;
use http::Method;
use serde::Deserialize;

use super::{
    Config, DEFAULT_ADMIN, DEFAULT_LISTEN, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_REQUEST_BODY,
    DEFAULT_MAX_SERVICES, DEFAULT_REGISTRY, DEFAULT_SHUTDOWN_TIMEOUT, MAX_DURATION,
    MAX_MAX_CONNECTIONS, MAX_MAX_REQUEST_BODY, MAX_MAX_SERVICES, Overrides, Routing, ServiceEntry,
    ServiceSettings,
};
use crate::naming;

/// Largest config file read: 1 MiB.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Why a config could not be built. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {}: {reason}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error, or "larger than 1 MiB".
        reason: String,
    },
    /// The file is not TOML, or has a key or type the proxy does not know.
    #[error("{}: {message}", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The TOML parser's message (line, column and key path included), on one line.
        message: String,
    },
    /// Values that break a rule; each problem names its field.
    #[error("{}: {}", source_name(path.as_deref()), problems.join("; "))]
    Invalid {
        /// The file (`None`: the command line).
        path: Option<PathBuf>,
        /// One line per problem, e.g. `services.orders.retry.max_attempts must be 1-10, got 0`.
        problems: Vec<String>,
    },
}

fn source_name(path: Option<&Path>) -> String {
    path.map_or_else(|| "command line".to_owned(), |p| p.display().to_string())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    registry: Option<String>,
    listen: Option<String>,
    admin: Option<String>,
    namespace: Option<String>,
    group: Option<String>,
    max_request_body: Option<usize>,
    max_services: Option<usize>,
    max_connections: Option<usize>,
    shutdown_timeout: Option<String>,
    #[serde(default)]
    defaults: ServiceFile,
    #[serde(default)]
    services: BTreeMap<String, ServiceFile>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceFile {
    service: Option<String>,
    group: Option<String>,
    namespace: Option<String>,
    balancer: Option<String>,
    idempotent_methods: Option<Vec<String>>,
    attempt_timeout: Option<String>,
    connect_timeout: Option<String>,
    pool_idle_timeout: Option<String>,
    first_view_wait: Option<String>,
    retry: Option<RetryFile>,
    outlier: Option<OutlierFile>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryFile {
    enabled: Option<bool>,
    max_attempts: Option<u32>,
    per_try_timeout: Option<String>,
    budget_window: Option<String>,
    retry_ratio: Option<f32>,
    min_retries_per_second: Option<u32>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct OutlierFile {
    enabled: Option<bool>,
    window: Option<String>,
    min_request_rate: Option<f64>,
    error_rate_threshold: Option<f64>,
    errors: Option<String>,
    consecutive_failures: Option<u32>,
    max_ejection_ratio: Option<f64>,
    recovery_unit: Option<String>,
    max_checks: Option<u32>,
    check: Option<String>,
    check_timeout: Option<String>,
}

/// Collects problems, each prefixed with the table it is in.
struct Problems(Vec<String>);

impl Problems {
    fn push(&mut self, field: &str, message: impl std::fmt::Display) {
        self.0.push(format!("{field}: {message}"));
    }

    fn duration(&mut self, field: &str, value: Option<&str>, into: &mut Duration) {
        let Some(text) = value else { return };
        match gangway_core::duration::parse(text) {
            Ok(d) if d.is_zero() => self.push(field, "must be > 0"),
            Ok(d) if d > MAX_DURATION => self.push(field, format!("{text:?} is above 24 h")),
            Ok(d) => *into = d,
            Err(e) => self.push(field, e),
        }
    }

    fn address(&mut self, field: &str, text: &str) -> Option<SocketAddr> {
        match text.parse() {
            Ok(a) => Some(a),
            Err(_) => {
                self.push(field, format!("expected IP:PORT, got {text:?}"));
                None
            }
        }
    }

    fn limit(&mut self, field: &str, value: Option<usize>, max: usize, into: &mut usize) {
        match value {
            Some(v) if v == 0 || v > max => self.push(field, format!("must be 1-{max}, got {v}")),
            Some(v) => *into = v,
            None => {}
        }
    }
}

pub(super) fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
    let file = match path {
        Some(p) => parse(p, &read(p)?)?,
        None => File::default(),
    };
    resolve(file, path, overrides)
}

fn read(path: &Path) -> Result<String, ConfigError> {
    let error = |reason: String| ConfigError::Read {
        path: path.to_owned(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| error(e.to_string()))?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(error(format!("larger than {MAX_FILE_BYTES} bytes")));
    }
    std::fs::read_to_string(path).map_err(|e| error(e.to_string()))
}

fn parse(path: &Path, text: &str) -> Result<File, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Syntax {
        path: path.to_owned(),
        // One line: the parser's message spans several (a caret under the key).
        message: e
            .to_string()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && *l != "|")
            .collect::<Vec<_>>()
            .join(" "),
    })
}

fn resolve(file: File, path: Option<&Path>, o: &Overrides) -> Result<Config, ConfigError> {
    let mut p = Problems(Vec::new());
    let registry = o
        .registry
        .clone()
        .or(file.registry)
        .unwrap_or_else(|| DEFAULT_REGISTRY.to_owned());
    if registry.trim().is_empty() {
        p.push("registry", "must not be empty");
    }
    let default_listen: SocketAddr = DEFAULT_LISTEN.parse().expect("a valid constant");
    let listen = match (o.listen, file.listen) {
        (Some(a), _) => a,
        (None, Some(text)) => p.address("listen", &text).unwrap_or(default_listen),
        (None, None) => default_listen,
    };
    let admin = match (&o.admin, file.admin) {
        (Some(a), _) => *a,
        (None, Some(text)) if text == "off" => None,
        (None, Some(text)) => p.address("admin", &text),
        (None, None) => Some(DEFAULT_ADMIN.parse().expect("a valid constant")),
    };
    let (default_ns, default_group) = super::default_names();
    let namespace = o.namespace.clone().or(file.namespace).unwrap_or(default_ns);
    let group = o.group.clone().or(file.group).unwrap_or(default_group);
    for (field, value) in [("namespace", &namespace), ("group", &group)] {
        if let Err(e) = gangway_core::validate::name(field, value) {
            p.push(field, e.message);
        }
    }
    let mut max_request_body = DEFAULT_MAX_REQUEST_BODY;
    p.limit(
        "max_request_body",
        file.max_request_body,
        MAX_MAX_REQUEST_BODY,
        &mut max_request_body,
    );
    let mut max_services = DEFAULT_MAX_SERVICES;
    p.limit(
        "max_services",
        file.max_services,
        MAX_MAX_SERVICES,
        &mut max_services,
    );
    let mut max_connections = DEFAULT_MAX_CONNECTIONS;
    p.limit(
        "max_connections",
        file.max_connections,
        MAX_MAX_CONNECTIONS,
        &mut max_connections,
    );
    let mut shutdown_timeout = DEFAULT_SHUTDOWN_TIMEOUT;
    p.duration(
        "shutdown_timeout",
        file.shutdown_timeout.as_deref(),
        &mut shutdown_timeout,
    );

    for field in ["service", "group", "namespace"] {
        let set = match field {
            "service" => file.defaults.service.is_some(),
            "group" => file.defaults.group.is_some(),
            _ => file.defaults.namespace.is_some(),
        };
        if set {
            p.push(
                &format!("defaults.{field}"),
                "only a [services.NAME] table names a service; set the top-level group/namespace",
            );
        }
    }
    let defaults = Arc::new(settings(
        &ServiceSettings::default(),
        &file.defaults,
        "defaults",
        &mut p,
    ));
    let mut services = BTreeMap::new();
    for (name, table) in &file.services {
        let prefix = format!("services.{name}");
        let key = entry_key(name, table, &namespace, &group, &prefix, &mut p);
        let settings = Arc::new(settings(&defaults, table, &prefix, &mut p));
        if let Some(key) = key {
            services.insert(name.clone(), Arc::new(ServiceEntry { key, settings }));
        }
    }
    // Two tables for one service would leave its settings to the order of the tables.
    let mut tables: BTreeMap<&ServiceKey, &str> = BTreeMap::new();
    for (name, entry) in &services {
        if let Some(first) = tables.insert(&entry.key, name) {
            p.push(
                &format!("services.{name}"),
                format!(
                    "routes to {} like services.{first}; list each service once",
                    entry.key
                ),
            );
        }
    }
    if services.len() > max_services {
        p.push(
            "services",
            format!(
                "{} tables, above max_services {max_services}",
                services.len()
            ),
        );
    }
    if !p.0.is_empty() {
        return Err(ConfigError::Invalid {
            path: path.map(Path::to_owned),
            problems: p.0,
        });
    }
    Ok(Config {
        registry,
        listen,
        admin,
        max_connections,
        shutdown_timeout,
        file: path.map(Path::to_owned),
        routing: Arc::new(Routing {
            namespace,
            group,
            max_request_body,
            max_services,
            defaults,
            services,
        }),
    })
}

/// The service a `[services.NAME]` table routes to: NAME read as a host name, with its
/// `service`, `group` and `namespace` keys winning.
fn entry_key(
    name: &str,
    table: &ServiceFile,
    namespace: &str,
    group: &str,
    prefix: &str,
    p: &mut Problems,
) -> Option<ServiceKey> {
    let base = match &table.service {
        // NAME is only an alias then: it need not parse as SERVICE.GROUP.NAMESPACE.
        Some(_) => ServiceKey::new(namespace, group, name),
        None => match naming::service_key(name, namespace, group) {
            Ok(k) => k,
            Err(e) => {
                p.push(prefix, e);
                return None;
            }
        },
    };
    let key = ServiceKey::new(
        table.namespace.as_deref().unwrap_or(&base.namespace),
        table.group.as_deref().unwrap_or(&base.group),
        table.service.as_deref().unwrap_or(&base.service),
    );
    let mut ok = true;
    for (field, value) in [
        ("service", &key.service),
        ("group", &key.group),
        ("namespace", &key.namespace),
    ] {
        if let Err(e) = gangway_core::validate::name(field, value) {
            p.push(&format!("{prefix}.{field}"), e.message);
            ok = false;
        }
    }
    ok.then_some(key)
}

/// `base` with the values `table` sets; problems are prefixed with `prefix`.
fn settings(
    base: &ServiceSettings,
    table: &ServiceFile,
    prefix: &str,
    p: &mut Problems,
) -> ServiceSettings {
    let mut s = base.clone();
    let field = |name: &str| format!("{prefix}.{name}");
    if let Some(text) = &table.balancer {
        match text.as_str() {
            "round-robin" => s.balancer = BalancerKind::RoundRobin,
            "weighted" => s.balancer = BalancerKind::Weighted,
            "random" => s.balancer = BalancerKind::Random,
            "p2c" => s.balancer = BalancerKind::PowerOfTwoChoices,
            other => p.push(
                &field("balancer"),
                format!("expected round-robin, weighted, random or p2c; got {other:?}"),
            ),
        }
    }
    if let Some(methods) = &table.idempotent_methods {
        let mut parsed = Vec::new();
        for m in methods {
            match Method::from_bytes(m.as_bytes()) {
                Ok(method) if m.chars().all(|c| c.is_ascii_uppercase()) => parsed.push(method),
                _ => p.push(
                    &field("idempotent_methods"),
                    format!("{m:?} is not an upper-case HTTP method"),
                ),
            }
        }
        s.idempotent_methods = parsed;
    }
    p.duration(
        &field("attempt_timeout"),
        table.attempt_timeout.as_deref(),
        &mut s.attempt_timeout,
    );
    p.duration(
        &field("connect_timeout"),
        table.connect_timeout.as_deref(),
        &mut s.connect_timeout,
    );
    p.duration(
        &field("pool_idle_timeout"),
        table.pool_idle_timeout.as_deref(),
        &mut s.pool_idle_timeout,
    );
    p.duration(
        &field("first_view_wait"),
        table.first_view_wait.as_deref(),
        &mut s.first_view_wait,
    );
    if let Some(r) = &table.retry {
        retry(&mut s, r, prefix, p);
    }
    if let Some(o) = &table.outlier {
        outlier(&mut s, o, prefix, p);
    }
    s
}

fn retry(s: &mut ServiceSettings, r: &RetryFile, prefix: &str, p: &mut Problems) {
    let field = |name: &str| format!("{prefix}.retry.{name}");
    let retry = &mut s.retry;
    if let Some(n) = r.max_attempts {
        retry.max_attempts = n;
    }
    if let Some(text) = &r.per_try_timeout {
        let mut d = Duration::ZERO;
        p.duration(&field("per_try_timeout"), Some(text), &mut d);
        if !d.is_zero() {
            retry.per_try_timeout = Some(d);
        }
    }
    p.duration(
        &field("budget_window"),
        r.budget_window.as_deref(),
        &mut retry.budget_window,
    );
    if let Some(ratio) = r.retry_ratio {
        retry.retry_ratio = ratio;
    }
    if let Some(n) = r.min_retries_per_second {
        retry.min_retries_per_second = n;
    }
    if r.enabled == Some(false) {
        retry.max_attempts = 1;
    }
    // The client's own rules, named as they are in this file.
    for problem in retry.problems() {
        let text = problem.strip_prefix("retry.").unwrap_or(&problem);
        let (name, rule) = text.split_once(' ').unwrap_or((text, ""));
        p.push(&field(name), rule);
    }
}

fn outlier(s: &mut ServiceSettings, o: &OutlierFile, prefix: &str, p: &mut Problems) {
    let field = |name: &str| format!("{prefix}.outlier.{name}");
    if o.enabled == Some(false) {
        s.outlier = None;
        return;
    }
    let mut c = s.outlier.clone().unwrap_or_default();
    p.duration(&field("window"), o.window.as_deref(), &mut c.window);
    p.duration(
        &field("recovery_unit"),
        o.recovery_unit.as_deref(),
        &mut c.recovery_unit,
    );
    p.duration(
        &field("check_timeout"),
        o.check_timeout.as_deref(),
        &mut c.check_timeout,
    );
    if let Some(v) = o.min_request_rate {
        c.min_request_rate = v;
    }
    if let Some(v) = o.error_rate_threshold {
        c.error_rate_threshold = v;
    }
    if let Some(v) = o.consecutive_failures {
        c.consecutive_failures = v;
    }
    if let Some(v) = o.max_ejection_ratio {
        c.max_ejection_ratio = v;
    }
    if let Some(v) = o.max_checks {
        c.max_checks = v;
    }
    match o.errors.as_deref() {
        None => {}
        Some("network") => c.errors = ErrorKinds::NetworkOnly,
        Some("network-and-5xx") => c.errors = ErrorKinds::NetworkAndServerErrors,
        Some(other) => p.push(
            &field("errors"),
            format!("expected network or network-and-5xx, got {other:?}"),
        ),
    }
    match o.check.as_deref() {
        None => {}
        Some("request") => c.check = RecoveryCheck::Request,
        Some("tcp") => c.check = RecoveryCheck::TcpConnect,
        Some(other) => p.push(
            &field("check"),
            format!("expected request or tcp, got {other:?}"),
        ),
    }
    if let Err(gangway_client::Error::InvalidConfig { problems }) = c.validate() {
        for problem in problems {
            let text = problem.strip_prefix("outlier.").unwrap_or(&problem);
            let (name, rule) = text.split_once(": ").unwrap_or((text, ""));
            p.push(&field(name), rule);
        }
    }
    s.outlier = Some(c);
}
