//! [`EtcdConfig`]: where the etcd cluster is, the key prefix, and the bounds of every call.

use std::time::Duration;

/// Key prefix by default (`--etcd-prefix`).
pub const DEFAULT_PREFIX: &str = "/gangway";
/// Endpoint by default: etcd's own default client URL.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:2379";
/// Deadline of one store call (`apply`, or one page of `load`), retries included: 5 s.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of the first connection at start-up: 5 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Most operations in one etcd transaction: 128, etcd's default `--max-txn-ops`.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;
/// Keys read per range request of `load`: 1000 (about 0.5 MB of instances; etcd's default
/// request limit is 1.5 MiB and its gRPC receive limit 2 GiB).
pub const DEFAULT_PAGE_SIZE: usize = 1000;
/// Most endpoints: 32.
pub const MAX_ENDPOINTS: usize = 32;

/// How to reach etcd and bound each call. Checked by [`EtcdConfig::validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs, `http://HOST:PORT`, 1 to [`MAX_ENDPOINTS`]; the client balances over them
    /// and leaves out one that does not answer. Default [`DEFAULT_ENDPOINT`].
    pub endpoints: Vec<String>,
    /// Key prefix: starts with `/`, no trailing `/`, no whitespace, at most 128 bytes.
    /// Default [`DEFAULT_PREFIX`]. Two gangway clusters on one etcd use two prefixes.
    pub prefix: String,
    /// Deadline of one call, retries included (100 ms-10 m). Default
    /// [`DEFAULT_REQUEST_TIMEOUT`].
    pub request_timeout: Duration,
    /// Deadline of the first connection (100 ms-10 m). Default [`DEFAULT_CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
    /// Most distinct keys one batch writes (1-10000); must not exceed the etcd server's
    /// `--max-txn-ops`. Default [`DEFAULT_MAX_TXN_OPS`].
    pub max_txn_ops: usize,
    /// Keys per range request of `load` (1-10000). Default [`DEFAULT_PAGE_SIZE`].
    pub page_size: usize,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        Self {
            endpoints: vec![DEFAULT_ENDPOINT.to_owned()],
            prefix: DEFAULT_PREFIX.to_owned(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_txn_ops: DEFAULT_MAX_TXN_OPS,
            page_size: DEFAULT_PAGE_SIZE,
        }
    }
}

/// One rule a field breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The [`EtcdConfig`] field (`endpoints`, `prefix`, ...).
    pub field: &'static str,
    /// What is wrong, with the value given.
    pub message: String,
}

/// Every problem of a configuration, in field order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .problems.iter().map(|p| format!("{}: {}", p.field, p.message)).collect::<Vec<_>>().join("; "))]
pub struct ConfigError {
    /// At least one.
    pub problems: Vec<Problem>,
}

impl EtcdConfig {
    /// Checks every field against the bounds documented on it.
    ///
    /// Errors: every broken rule, each naming its field and the value given.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        let mut bad = |field, message: String| problems.push(Problem { field, message });
        if self.endpoints.is_empty() || self.endpoints.len() > MAX_ENDPOINTS {
            bad(
                "endpoints",
                format!(
                    "must list 1-{MAX_ENDPOINTS} URLs, got {}",
                    self.endpoints.len()
                ),
            );
        }
        for e in &self.endpoints {
            if let Err(m) = check_endpoint(e) {
                bad("endpoints", m);
            }
        }
        if let Err(m) = check_prefix(&self.prefix) {
            bad("prefix", m);
        }
        for (field, d) in [
            ("request_timeout", self.request_timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if !(Duration::from_millis(100)..=Duration::from_secs(600)).contains(&d) {
                bad(field, format!("must be 100ms-10m, got {d:?}"));
            }
        }
        for (field, n) in [
            ("max_txn_ops", self.max_txn_ops),
            ("page_size", self.page_size),
        ] {
            if !(1..=10_000).contains(&n) {
                bad(field, format!("must be 1-10000, got {n}"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems })
        }
    }
}

/// Splits a comma-separated endpoint list (`--etcd-endpoints`) and checks each URL.
///
/// Errors: an empty entry, or an entry [`check_endpoint`] refuses; the message names it.
pub fn parse_endpoints(list: &str) -> Result<Vec<String>, String> {
    let endpoints: Vec<String> = list.split(',').map(|e| e.trim().to_owned()).collect();
    for e in &endpoints {
        check_endpoint(e)?;
    }
    if endpoints.len() > MAX_ENDPOINTS {
        return Err(format!(
            "must list 1-{MAX_ENDPOINTS} URLs, got {}",
            endpoints.len()
        ));
    }
    Ok(endpoints)
}

/// An endpoint is `http://HOST:PORT` (HOST a name or an IP address, `[v6]` in brackets,
/// PORT 1-65535). `https://` is refused: TLS to etcd is not built yet (docs/cluster.md).
///
/// Errors: the rule broken, quoting the endpoint.
pub fn check_endpoint(e: &str) -> Result<(), String> {
    if e.is_empty() {
        return Err("an empty endpoint (two commas, or a trailing one?)".into());
    }
    if e.starts_with("https://") {
        return Err(format!(
            "{e:?}: TLS to etcd is not supported yet; use http:// on a trusted network"
        ));
    }
    let Some(authority) = e.strip_prefix("http://") else {
        return Err(format!("{e:?} must look like http://HOST:PORT"));
    };
    let port = authority
        .rsplit_once(':')
        .filter(|(host, _)| !host.is_empty() && !host.contains('/'))
        .and_then(|(_, port)| port.parse::<u16>().ok())
        .filter(|p| *p > 0);
    match port {
        Some(_) => Ok(()),
        None => Err(format!("{e:?} must look like http://HOST:PORT")),
    }
}

fn check_prefix(p: &str) -> Result<(), String> {
    if !p.starts_with('/') || p.len() < 2 || p.ends_with('/') {
        return Err(format!(
            "must start with / and not end with / (e.g. /gangway), got {p:?}"
        ));
    }
    if p.len() > 128 || p.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "must be at most 128 bytes without spaces or control characters, got {p:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_documented() {
        let c = EtcdConfig::default();
        c.validate().expect("valid");
        assert_eq!(c.prefix, "/gangway");
        assert_eq!(c.endpoints, ["http://127.0.0.1:2379"]);
        assert_eq!(c.max_txn_ops, 128);
    }

    #[test]
    fn endpoint_lists_are_split_and_checked() {
        assert_eq!(
            parse_endpoints("http://127.0.0.1:2379, http://[::1]:2380,http://etcd-0.local:1")
                .unwrap(),
            [
                "http://127.0.0.1:2379",
                "http://[::1]:2380",
                "http://etcd-0.local:1"
            ]
        );
        for (bad, says) in [
            ("", "empty endpoint"),
            ("http://a:1,,http://b:2", "empty endpoint"),
            ("127.0.0.1:2379", "must look like http://HOST:PORT"),
            ("http://127.0.0.1", "must look like http://HOST:PORT"),
            ("http://127.0.0.1:0", "must look like http://HOST:PORT"),
            ("http://:2379", "must look like http://HOST:PORT"),
            ("http://a:2379/x", "must look like http://HOST:PORT"),
            ("https://a:2379", "TLS to etcd is not supported yet"),
        ] {
            let e = parse_endpoints(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
        let many = vec!["http://a:1"; MAX_ENDPOINTS + 1].join(",");
        assert!(parse_endpoints(&many).unwrap_err().contains("1-32 URLs"));
    }

    #[test]
    fn every_problem_is_reported_with_its_field() {
        let c = EtcdConfig {
            endpoints: vec![],
            prefix: "gangway/".into(),
            request_timeout: Duration::ZERO,
            connect_timeout: Duration::from_secs(1),
            max_txn_ops: 0,
            page_size: 20_000,
        };
        let e = c.validate().expect_err("invalid");
        let fields: Vec<&str> = e.problems.iter().map(|p| p.field).collect();
        assert_eq!(
            fields,
            [
                "endpoints",
                "prefix",
                "request_timeout",
                "max_txn_ops",
                "page_size"
            ]
        );
        let text = e.to_string();
        assert!(text.contains("prefix: must start with /"), "{text}");
        for p in ["/", "/a b", "/x/"] {
            let c = EtcdConfig {
                prefix: p.into(),
                ..EtcdConfig::default()
            };
            assert_eq!(c.validate().unwrap_err().problems[0].field, "prefix", "{p}");
        }
    }
}
