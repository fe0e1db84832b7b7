//! Input rules (issues #2 and #9). Each check returns a [`ValidationError`] naming the field and
//! the rule; callers validate the whole request before changing anything.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use crate::model::{InstanceKey, ProbeSpec, ServiceKey};

/// Longest namespace, group, service or cluster name, in characters.
pub const MAX_NAME_LEN: usize = 128;
/// Longest host name (RFC 1123), in characters.
pub const MAX_HOST_LEN: usize = 253;
/// Largest weight.
pub const MAX_WEIGHT: f64 = 10_000.0;
/// Smallest weight above 0. Below it a weight is either a typo or a rounding artefact
/// (`-0.0`, subnormals such as `5e-324`) that would count as serving while receiving no traffic.
pub const MIN_WEIGHT: f64 = 0.001;
/// Shortest lease TTL (and so delete timeout): 100 ms.
pub const MIN_LEASE: Duration = Duration::from_millis(100);
/// Longest lease TTL or delete timeout: 24 h. A longer lease is an instance that never
/// expires, which is what a persistent instance is for.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);
/// Shortest probe interval, ms.
pub const MIN_PROBE_INTERVAL_MS: u64 = 100;
/// Longest probe interval, ms: 1 h.
pub const MAX_PROBE_INTERVAL_MS: u64 = 3_600_000;
/// Largest probe `fall` or `rise` count.
pub const MAX_PROBE_COUNT: u32 = 100;
/// Longest HTTP probe path, in bytes (the path is stored durably with the instance).
pub const MAX_PROBE_PATH_BYTES: usize = 1024;
/// Most metadata keys per instance or service.
pub const MAX_METADATA_KEYS: usize = 64;
/// Longest metadata key, in bytes.
pub const MAX_METADATA_KEY_BYTES: usize = 256;
/// Most metadata bytes (keys plus values) per instance or service: 16 KiB.
pub const MAX_METADATA_BYTES: usize = 16 * 1024;

/// A rejected input: which field, and which rule it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    /// Request field, e.g. `"port"` or `"metadata"`.
    pub field: String,
    /// The rule, readable, e.g. `"must be 1-65535, got 0"`.
    pub message: String,
}

impl ValidationError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A namespace, group, service or cluster name: 1-128 characters of ASCII letters, digits,
/// `.`, `_`, `-`, `:`, and not `.` or `..`. (So no empty names, whitespace, control
/// characters or Nacos's `@@`; and no names that are URL dot segments, which HTTP clients
/// resolve away (RFC 3986 §5.2.4), so that `/v1/services/../instances` could never reach them.)
pub fn name(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if value == "." || value == ".." {
        return Err(ValidationError::new(
            field,
            format!("must not be {value:?}: URLs drop the dot segments \".\" and \"..\""),
        ));
    }
    let len = value.chars().count();
    if len > MAX_NAME_LEN {
        return Err(ValidationError::new(
            field,
            format!("must be at most {MAX_NAME_LEN} characters, got {len}"),
        ));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':')))
    {
        return Err(ValidationError::new(
            field,
            format!(
                "may hold only letters, digits, '.', '_', '-', ':'; found {:?}",
                bad
            ),
        ));
    }
    Ok(())
}

/// All three parts of a service key.
pub fn service_key(key: &ServiceKey) -> Result<(), ValidationError> {
    name("namespace", &key.namespace)?;
    name("group", &key.group)?;
    name("service", &key.service)
}

/// An instance key: ip (IPv4/IPv6 literal or RFC 1123 host name, at most 253 characters),
/// port 1-65535, cluster name.
pub fn instance_key(key: &InstanceKey) -> Result<(), ValidationError> {
    ip(&key.ip)?;
    port(u32::from(key.port))?;
    name("cluster", &key.cluster)
}

/// A port as received (wider than u16 so that 0 and 70000 are reported, not wrapped).
pub fn port(value: u32) -> Result<u16, ValidationError> {
    match u16::try_from(value) {
        Ok(p) if p >= 1 => Ok(p),
        _ => Err(ValidationError::new(
            "port",
            format!("must be 1-65535, got {value}"),
        )),
    }
}

/// An IPv4 or IPv6 literal, or an RFC 1123 host name of at most 253 characters.
pub fn ip(value: &str) -> Result<(), ValidationError> {
    if let Ok(addr) = value.parse::<IpAddr>() {
        // An address no consumer can connect to is refused rather than handed out.
        let unusable = addr.is_unspecified()
            || addr.is_multicast()
            || matches!(addr, IpAddr::V4(v4) if v4.is_broadcast());
        if unusable {
            return Err(ValidationError::new(
                "ip",
                format!(
                    "must be an address consumers can connect to, got {value} (unspecified, broadcast or multicast)"
                ),
            ));
        }
        return Ok(());
    }
    let rule = "must be an IPv4 or IPv6 literal or an RFC 1123 host name";
    if value.is_empty() {
        return Err(ValidationError::new("ip", "must not be empty"));
    }
    if value.len() > MAX_HOST_LEN {
        return Err(ValidationError::new(
            "ip",
            format!(
                "{rule} of at most {MAX_HOST_LEN} characters, got {}",
                value.len()
            ),
        ));
    }
    let host = value.strip_suffix('.').unwrap_or(value);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    // A name made only of digits and dots would be a malformed IPv4 literal, not a host name.
    let looks_numeric = host.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if host.split('.').all(label_ok) && !looks_numeric {
        Ok(())
    } else {
        Err(ValidationError::new("ip", format!("{rule}, got {value:?}")))
    }
}

/// Parses an instance address `ip:port`, `host:port` or `[ipv6]:port` into a checked
/// (ip, port). Errors name the field `addr` (shape) or `ip` / `port` (their rules).
pub fn addr(value: &str) -> Result<(String, u16), ValidationError> {
    let shape = || {
        ValidationError::new(
            "addr",
            format!("must be IP:PORT, HOST:PORT or [IPV6]:PORT, got {value:?}"),
        )
    };
    let (host, port_text) = if let Some(rest) = value.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or_else(shape)?;
        (host, tail.strip_prefix(':').ok_or_else(shape)?)
    } else {
        let (host, port) = value.rsplit_once(':').ok_or_else(shape)?;
        if host.contains(':') {
            return Err(shape());
        }
        (host, port)
    };
    let port_number: u32 = port_text
        .parse()
        .map_err(|_| ValidationError::new("port", format!("must be 1-65535, got {port_text:?}")))?;
    let port = port(port_number)?;
    ip(host)?;
    Ok((host.to_owned(), port))
}

/// A weight: exactly `0` (never picked), or a number from [`MIN_WEIGHT`] (0.001) to
/// [`MAX_WEIGHT`] (10000). Refused: negatives, `-0.0` (it would be echoed back as `-0.0`),
/// anything between 0 and 0.001 (subnormals such as `5e-324` included), NaN and infinities.
pub fn weight(value: f64) -> Result<(), ValidationError> {
    // `to_bits` tells +0.0 from -0.0, which compare equal.
    if value.to_bits() == 0 || (MIN_WEIGHT..=MAX_WEIGHT).contains(&value) {
        Ok(())
    } else {
        Err(ValidationError::new(
            "weight",
            format!("must be 0 or a number 0.001-10000, got {value:?}"),
        ))
    }
}

/// A lease TTL (field `ttl_ms`): the time without a heartbeat after which an instance is
/// unhealthy, [`MIN_LEASE`] (100 ms) to [`MAX_LEASE`] (24 h) inclusive.
pub fn lease_ttl(ttl: Duration) -> Result<(), ValidationError> {
    if (MIN_LEASE..=MAX_LEASE).contains(&ttl) {
        Ok(())
    } else {
        Err(ValidationError::new(
            "ttl_ms",
            format!(
                "must be {}-{} (24 h), got {}",
                MIN_LEASE.as_millis(),
                MAX_LEASE.as_millis(),
                ttl.as_millis()
            ),
        ))
    }
}

/// A lease delete timeout (field `delete_timeout_ms`): the time without a heartbeat after which
/// an instance is deleted, at least its `ttl` and at most [`MAX_LEASE`] (24 h).
pub fn lease_delete_timeout(
    ttl: Duration,
    delete_timeout: Duration,
) -> Result<(), ValidationError> {
    if (ttl..=MAX_LEASE).contains(&delete_timeout) {
        Ok(())
    } else {
        Err(ValidationError::new(
            "delete_timeout_ms",
            format!(
                "must be at least the TTL ({} ms) and at most {} (24 h), got {}",
                ttl.as_millis(),
                MAX_LEASE.as_millis(),
                delete_timeout.as_millis()
            ),
        ))
    }
}

/// A lease: [`lease_ttl`], then [`lease_delete_timeout`].
pub fn lease(ttl: Duration, delete_timeout: Duration) -> Result<(), ValidationError> {
    lease_ttl(ttl)?;
    lease_delete_timeout(ttl, delete_timeout)
}

/// A probe interval (field `probe.interval_ms`), ms: [`MIN_PROBE_INTERVAL_MS`] (100) to
/// [`MAX_PROBE_INTERVAL_MS`] (3600000, 1 h) inclusive.
pub fn probe_interval_ms(value: u64) -> Result<(), ValidationError> {
    if (MIN_PROBE_INTERVAL_MS..=MAX_PROBE_INTERVAL_MS).contains(&value) {
        Ok(())
    } else {
        Err(ValidationError::new(
            "probe.interval_ms",
            format!("must be {MIN_PROBE_INTERVAL_MS}-{MAX_PROBE_INTERVAL_MS}, got {value}"),
        ))
    }
}

/// A probe's `fall` or `rise` count (`field` is `probe.fall` or `probe.rise`): consecutive
/// results, 1 to [`MAX_PROBE_COUNT`] (100).
pub fn probe_count(field: &str, value: u32) -> Result<(), ValidationError> {
    if (1..=MAX_PROBE_COUNT).contains(&value) {
        Ok(())
    } else {
        Err(ValidationError::new(
            field,
            format!("must be 1-{MAX_PROBE_COUNT}, got {value}"),
        ))
    }
}

/// An HTTP probe's path (field `probe.path`): starts with `/`, at most
/// [`MAX_PROBE_PATH_BYTES`] (1024) bytes, no whitespace or control characters.
pub fn probe_path(value: &str) -> Result<(), ValidationError> {
    if value.len() > MAX_PROBE_PATH_BYTES {
        return Err(ValidationError::new(
            "probe.path",
            format!(
                "must be at most {MAX_PROBE_PATH_BYTES} bytes, got {}",
                value.len()
            ),
        ));
    }
    if !value.starts_with('/') || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ValidationError::new(
            "probe.path",
            format!("must start with '/' and hold no spaces or control characters, got {value:?}"),
        ));
    }
    Ok(())
}

/// A probe: [`probe_interval_ms`], [`probe_count`] of `fall` and `rise`, [`probe_path`].
pub fn probe(spec: &ProbeSpec) -> Result<(), ValidationError> {
    probe_interval_ms(spec.interval_ms)?;
    probe_count("probe.fall", spec.fall)?;
    probe_count("probe.rise", spec.rise)?;
    probe_path(&spec.path)
}

/// Metadata: at most 64 keys and 16 KiB of keys plus values; keys 1-256 bytes without control
/// characters (values are free text).
pub fn metadata(value: &BTreeMap<String, String>) -> Result<(), ValidationError> {
    if value.len() > MAX_METADATA_KEYS {
        return Err(ValidationError::new(
            "metadata",
            format!(
                "must have at most {MAX_METADATA_KEYS} keys, got {}",
                value.len()
            ),
        ));
    }
    if value.keys().any(String::is_empty) {
        return Err(ValidationError::new("metadata", "keys must not be empty"));
    }
    if let Some(key) = value
        .keys()
        .find(|k| k.len() > MAX_METADATA_KEY_BYTES || k.chars().any(char::is_control))
    {
        return Err(ValidationError::new(
            "metadata",
            format!(
                "keys must be at most {MAX_METADATA_KEY_BYTES} bytes without control characters, got {:?}",
                key.chars().take(40).collect::<String>()
            ),
        ));
    }
    let bytes: usize = value.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_METADATA_BYTES {
        return Err(ValidationError::new(
            "metadata",
            format!("must be at most {MAX_METADATA_BYTES} bytes of keys and values, got {bytes}"),
        ));
    }
    Ok(())
}

/// A protect threshold (field `protect_threshold`, Nacos `protectThreshold`): +0.0, or a normal
/// number above 0 up to 1 (ratio); -0.0, subnormal numbers, NaN and infinities are refused.
pub fn protect_threshold(value: f64) -> Result<(), ValidationError> {
    // `to_bits` tells +0.0 from -0.0; subnormal numbers are refused so that what is stored
    // prints back as it was sent.
    if value.to_bits() == 0 || (value.is_normal() && value > 0.0 && value <= 1.0) {
        Ok(())
    } else {
        Err(ValidationError::new(
            "protect_threshold",
            format!("must be 0 or a ratio above 0 up to 1 (no -0, no subnormal), got {value:?}"),
        ))
    }
}

#[cfg(test)]
mod tests;
