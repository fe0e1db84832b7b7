//! Argument types shared by the commands and their parsers: `IP:PORT`, `K=V`, durations.
//!
//! Parsers return a one-line reason; clap prefixes it with the argument's name and exits 2.

use std::fmt;
use std::net::Ipv6Addr;
use std::time::Duration;

use clap::Args;
use gangway_core::validate;
use gangway_wire::client::{InstanceRef, ServiceRef};

/// An instance address as typed: `1.2.3.4:80`, `[::1]:80` or `host:80`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addr {
    /// IP literal (IPv6 without brackets) or host name.
    pub host: String,
    /// TCP port, 1..=65535.
    pub port: u16,
}

/// Names a service: `SERVICE [--namespace N] [--group G]`.
#[derive(Debug, Clone, Args)]
pub struct ServiceArgs {
    /// Service name.
    // Checked here too: `.` and `..` would be resolved out of the URL and reach another path.
    #[arg(value_name = "SERVICE", value_parser = parse_name)]
    pub service: String,
    /// Namespace [registry default: public].
    #[arg(long, short = 'n', env = "GANGWAY_NAMESPACE", value_parser = parse_name)]
    pub namespace: Option<String>,
    /// Group [registry default: DEFAULT_GROUP].
    #[arg(long, short = 'g', env = "GANGWAY_GROUP", value_parser = parse_name)]
    pub group: Option<String>,
}

/// Names an instance: `SERVICE IP:PORT [--namespace N] [--group G] [--cluster C]`.
#[derive(Debug, Clone, Args)]
pub struct InstanceArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub service: ServiceArgs,
    /// Instance address: 10.0.0.5:8080, [fd00::5]:8080 or host.example:8080.
    // `allow_hyphen_values`: `-host:8080` is a (bad) address, not a bundle of short flags
    // (`-h` would print the help and exit 0). Known flags in its place still parse as flags.
    #[arg(value_name = "IP:PORT", value_parser = parse_addr, allow_hyphen_values = true)]
    pub addr: Addr,
    /// Cluster [registry default: DEFAULT].
    #[arg(long, short = 'c', value_parser = parse_name)]
    pub cluster: Option<String>,
}

impl ServiceArgs {
    /// The service as the REST client names it (unset namespace and group are not sent).
    pub fn to_ref(&self) -> ServiceRef {
        ServiceRef {
            service: self.service.clone(),
            namespace: self.namespace.clone(),
            group: self.group.clone(),
        }
    }
}

impl InstanceArgs {
    /// The instance as the REST client names it (an unset cluster is not sent).
    pub fn to_ref(&self) -> InstanceRef {
        InstanceRef {
            service: self.service.to_ref(),
            ip: self.addr.host.clone(),
            port: self.addr.port,
            cluster: self.cluster.clone(),
        }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Parses `1.2.3.4:80`, `[::1]:80` or `host:80`.
pub fn parse_addr(s: &str) -> Result<Addr, String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or_else(|| {
            format!("missing ']' in {s:?} (expected [IPV6]:PORT, e.g. [::1]:8080)")
        })?;
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| format!("missing :PORT after ']' in {s:?} (e.g. [::1]:8080)"))?;
        if v6.parse::<Ipv6Addr>().is_err() {
            return Err(format!("{v6:?} is not an IPv6 address"));
        }
        (v6, port)
    } else {
        let (host, port) = s.rsplit_once(':').ok_or_else(|| {
            format!("missing :PORT in {s:?} (expected IP:PORT, e.g. 10.0.0.5:8080)")
        })?;
        if host.contains(':') {
            return Err(format!("IPv6 addresses need brackets: [{host}]:{port}"));
        }
        (host, port)
    };
    if host.is_empty() {
        return Err(format!(
            "missing host in {s:?} (expected IP:PORT, e.g. 10.0.0.5:8080)"
        ));
    }
    let port: u32 = port
        .parse()
        .map_err(|_| format!("port: must be a number 1-65535, got {port:?}"))?;
    let port = validate::port(port).map_err(|e| e.to_string())?;
    validate::ip(host).map_err(|e| format!("host {host:?}: {}", e.message))?;
    Ok(Addr {
        host: host.to_owned(),
        port,
    })
}

/// Most addresses one `--server` (or `--registry`) list may hold: 64, as the REST client's
/// [`MAX_SERVERS`](gangway_wire::client::MAX_SERVERS).
pub const MAX_SERVERS: usize = gangway_wire::client::MAX_SERVERS;

/// Checks a `--server` (or `--registry`) value: one address or several nodes of one registry
/// separated by commas, `HOST:PORT,HOST:PORT` (no spaces; at most [`MAX_SERVERS`], none twice,
/// all `https://` or none), each checked by [`parse_one_server`]. A bad entry of a list is named
/// by its position: `address 2 of 3: empty address (...)`. Returns the value as given.
pub fn parse_server(s: &str) -> Result<String, String> {
    let entries: Vec<&str> = s.split(',').collect();
    let n = entries.len();
    if n == 1 {
        return parse_one_server(s);
    }
    if n > MAX_SERVERS {
        return Err(format!("{n} addresses, at most {MAX_SERVERS}"));
    }
    for (i, entry) in entries.iter().enumerate() {
        let at = |why: String| format!("address {} of {n}: {why}", i + 1);
        parse_one_server(entry).map_err(at)?;
        if entries[..i].contains(entry) {
            return Err(at(format!("{entry:?} is given twice")));
        }
    }
    let https = entries.iter().filter(|e| e.starts_with("https://")).count();
    if https != 0 && https != n {
        return Err(format!(
            "mixes https:// and http:// addresses (the nodes of one registry serve alike), got \
             {s:?}"
        ));
    }
    Ok(s.to_owned())
}

/// The addresses of a [`parse_server`] value, in order.
pub fn server_list(s: &str) -> Vec<String> {
    s.split(',').map(str::to_owned).collect()
}

/// A session client's configuration over the registry addresses `list` (docs/cluster.md,
/// "Client failover"): the first attempt goes to a random one, or to the first with
/// `GANGWAY_RANDOM_START=0` in the environment (a deployment that wants its clients on one
/// node first; the tests).
pub fn session_config(list: Vec<String>) -> gangway_client::ClientConfig {
    let random = std::env::var("GANGWAY_RANDOM_START").map_or(true, |v| v != "0");
    gangway_client::ClientConfig::from_addresses(list).with_random_start(random)
}

/// Checks one address: `HOST:PORT` or `[IPV6]:PORT` with a port 1-65535, optionally prefixed
/// with `http://` or `https://` (TLS; `--ca` for a private CA) and a trailing `/`. Returns it
/// as given.
pub fn parse_one_server(s: &str) -> Result<String, String> {
    const SHAPE: &str = "expected HOST:PORT, e.g. 127.0.0.1:8848";
    if s.contains("://") && !s.starts_with("http://") && !s.starts_with("https://") {
        return Err(format!(
            "only http:// and https:// addresses are served ({SHAPE}), got {s:?}"
        ));
    }
    let rest = strip_scheme(s);
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Err(format!("empty address ({SHAPE})"));
    }
    if rest.contains(['/', '?', '#', '@']) || rest.contains(char::is_whitespace) {
        return Err(format!("{SHAPE}, got {s:?}"));
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (v6, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("missing ']' in {s:?} ({SHAPE} or [::1]:8848)"))?;
        if v6.parse::<Ipv6Addr>().is_err() {
            return Err(format!("{v6:?} is not an IPv6 address"));
        }
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| format!("missing :PORT in {s:?} ({SHAPE})"))?;
        (v6, port)
    } else {
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("missing :PORT in {s:?} ({SHAPE})"))?;
        if host.contains(':') {
            return Err(format!("IPv6 addresses need brackets: [{host}]:{port}"));
        }
        (host, port)
    };
    if host.is_empty() {
        return Err(format!("missing host in {s:?} ({SHAPE})"));
    }
    let port: u32 = port
        .parse()
        .map_err(|_| format!("port: must be a number 1-65535, got {port:?}"))?;
    validate::port(port).map_err(|e| e.to_string())?;
    Ok(s.to_owned())
}

/// `s` without its `http://` or `https://` prefix.
pub fn strip_scheme(s: &str) -> &str {
    s.strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"))
        .unwrap_or(s)
}

/// Checks a service, namespace, group or cluster name (1-128 letters, digits, `.`, `_`, `-`,
/// `:`; not `.` or `..`): [`validate::name`].
pub fn parse_name(s: &str) -> Result<String, String> {
    validate::name("name", s).map_err(|e| e.message)?;
    Ok(s.to_owned())
}

/// Parses an instance weight: 0, or a number 0.001-10000 ([`validate::weight`]).
pub fn parse_weight(s: &str) -> Result<f64, String> {
    let w: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("must be 0 or a number 0.001-10000, got {s:?}"))?;
    validate::weight(w).map_err(|e| e.message)?;
    Ok(w)
}

/// Parses a count: a whole number, 0 or more.
pub fn parse_count(s: &str) -> Result<u64, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("must be a whole number 0 or more, got {s:?}"))
}

/// Parses a period (a [duration](parse_duration) above zero).
pub fn parse_period(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("must be above 0, got {s:?}"));
    }
    Ok(d)
}

/// Parses a `KEY=VALUE` metadata pair (the value may be empty or hold `=`).
pub fn parse_meta(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))?;
    if k.trim().is_empty() {
        return Err(format!("empty key in {s:?} (expected KEY=VALUE)"));
    }
    Ok((k.to_owned(), v.to_owned()))
}

/// Parses a TCP port 1-65535. A value like `tcp://10.0.0.11:8848` is what Kubernetes puts in
/// `GANGWAY_PORT` for a Service named `gangway` in the pod's namespace (its Docker-link style
/// service variables); the error says so.
pub fn parse_port(s: &str) -> Result<u16, String> {
    if s.starts_with("tcp://") || s.starts_with("udp://") {
        return Err(format!(
            "must be a port 1-65535, got {s:?}: that is the variable Kubernetes sets for a \
             Service named gangway in this namespace; set enableServiceLinks: false in the pod \
             spec, or give the port explicitly"
        ));
    }
    let port: u32 = s
        .trim()
        .parse()
        .map_err(|_| format!("must be a port 1-65535, got {s:?}"))?;
    gangway_core::validate::port(port).map_err(|e| e.message)
}

pub use gangway_core::duration::{format as format_duration, parse as parse_duration};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addr_accepts_ipv4_ipv6_and_host_names() {
        assert_eq!(
            parse_addr("1.2.3.4:80"),
            Ok(Addr {
                host: "1.2.3.4".into(),
                port: 80
            })
        );
        assert_eq!(
            parse_addr("[::1]:80"),
            Ok(Addr {
                host: "::1".into(),
                port: 80
            })
        );
        assert_eq!(
            parse_addr("orders-1.svc.local:8080"),
            Ok(Addr {
                host: "orders-1.svc.local".into(),
                port: 8080
            })
        );
        assert_eq!(
            parse_addr("[fd00::5]:65535").unwrap().to_string(),
            "[fd00::5]:65535"
        );
        assert_eq!(parse_addr("1.2.3.4:80").unwrap().to_string(), "1.2.3.4:80");
    }

    #[test]
    fn addr_errors_say_what_is_wrong() {
        let err = |s| parse_addr(s).unwrap_err();
        assert!(
            err("1.2.3.4").contains("missing :PORT"),
            "{}",
            err("1.2.3.4")
        );
        assert_eq!(err("1.2.3.4:0"), "port: must be 1-65535, got 0");
        assert_eq!(err("1.2.3.4:70000"), "port: must be 1-65535, got 70000");
        assert!(err("1.2.3.4:http").contains("must be a number"));
        assert!(err("1.2.3.4:").contains("must be a number"));
        assert_eq!(err("::1:80"), "IPv6 addresses need brackets: [::1]:80");
        assert!(err("[::1:80").contains("missing ']'"));
        assert!(err("[::1]80").contains("missing :PORT after ']'"));
        assert!(err("[1.2.3.4]:80").contains("not an IPv6 address"));
        assert!(err(":80").contains("missing host"));
        assert!(
            err("bad host:80").starts_with("host \"bad host\""),
            "{}",
            err("bad host:80")
        );
    }

    #[test]
    fn a_server_list_names_its_bad_entry_by_position() {
        assert_eq!(
            parse_server("a:1,https://b:2").unwrap_err(),
            "mixes https:// and http:// addresses (the nodes of one registry serve alike), got \
             \"a:1,https://b:2\""
        );
        assert_eq!(
            parse_server("a:1,,b:2").unwrap_err(),
            "address 2 of 3: empty address (expected HOST:PORT, e.g. 127.0.0.1:8848)"
        );
        assert_eq!(
            parse_server("a:1,b:0").unwrap_err(),
            "address 2 of 2: port: must be 1-65535, got 0"
        );
        assert_eq!(
            parse_server("a:1,a:1").unwrap_err(),
            "address 2 of 2: \"a:1\" is given twice"
        );
        assert!(
            parse_server("a:1, b:2")
                .unwrap_err()
                .starts_with("address 2 of 2: ")
        );
        assert!(
            parse_server("a:1,")
                .unwrap_err()
                .starts_with("address 2 of 2: empty")
        );
        let many = vec!["h:1"; MAX_SERVERS + 1].join(",");
        assert_eq!(parse_server(&many).unwrap_err(), "65 addresses, at most 64");
        assert_eq!(parse_server("a:1,[::1]:2").unwrap(), "a:1,[::1]:2");
        assert_eq!(server_list("a:1,[::1]:2"), ["a:1", "[::1]:2"]);
        assert_eq!(server_list("a:1"), ["a:1"]);
    }

    #[test]
    fn meta_splits_at_the_first_equals_sign() {
        assert_eq!(parse_meta("zone=a"), Ok(("zone".into(), "a".into())));
        assert_eq!(parse_meta("expr=a=b"), Ok(("expr".into(), "a=b".into())));
        assert_eq!(parse_meta("empty="), Ok(("empty".into(), String::new())));
        assert!(
            parse_meta("zone")
                .unwrap_err()
                .contains("expected KEY=VALUE")
        );
        assert!(parse_meta("=a").unwrap_err().contains("empty key"));
    }

    #[test]
    fn durations_default_to_seconds_and_take_units() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1").is_err());
        assert!(
            parse_duration("5 days")
                .unwrap_err()
                .contains("unknown unit")
        );
    }

    #[test]
    fn durations_render_compactly() {
        assert_eq!(format_duration(Duration::from_millis(750)), "750ms");
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_secs(120)), "2m");
    }
}
