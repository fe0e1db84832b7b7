//! Identities and fields of services and instances (DESIGN §2).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Default namespace, as in Nacos (`Constants.DEFAULT_NAMESPACE_ID`).
pub const DEFAULT_NAMESPACE: &str = "public";
/// Default group, as in Nacos.
pub const DEFAULT_GROUP: &str = "DEFAULT_GROUP";
/// Default cluster, as in Nacos.
pub const DEFAULT_CLUSTER: &str = "DEFAULT";
/// Default instance weight.
pub const DEFAULT_WEIGHT: f64 = 1.0;

/// A service's identity: namespace > group > service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServiceKey {
    /// Namespace, default [`DEFAULT_NAMESPACE`].
    pub namespace: String,
    /// Group, default [`DEFAULT_GROUP`].
    pub group: String,
    /// Service name.
    pub service: String,
}

impl ServiceKey {
    /// A key; empty `namespace` or `group` take their defaults.
    pub fn new(namespace: &str, group: &str, service: &str) -> Self {
        Self {
            namespace: or_default(namespace, DEFAULT_NAMESPACE),
            group: or_default(group, DEFAULT_GROUP),
            service: service.to_owned(),
        }
    }

    /// A key in the default namespace and group.
    pub fn named(service: &str) -> Self {
        Self::new("", "", service)
    }
}

impl fmt::Display for ServiceKey {
    /// `namespace/group/service`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.group, self.service)
    }
}

/// An instance's identity inside its service: (ip, port, cluster).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct InstanceKey {
    /// IPv4/IPv6 literal or RFC 1123 host name.
    pub ip: String,
    /// TCP port, 1..=65535.
    pub port: u16,
    /// Cluster, default [`DEFAULT_CLUSTER`].
    pub cluster: String,
}

impl InstanceKey {
    /// A key; an empty `cluster` takes [`DEFAULT_CLUSTER`].
    pub fn new(ip: &str, port: u16, cluster: &str) -> Self {
        Self {
            ip: ip.to_owned(),
            port,
            cluster: or_default(cluster, DEFAULT_CLUSTER),
        }
    }

    /// `ip:port`, with brackets around IPv6 literals (`[::1]:80`).
    pub fn addr(&self) -> String {
        if self.ip.contains(':') {
            format!("[{}]:{}", self.ip, self.port)
        } else {
            format!("{}:{}", self.ip, self.port)
        }
    }
}

impl fmt::Display for InstanceKey {
    /// `ip:port` (cluster `DEFAULT`) or `ip:port@cluster`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cluster == DEFAULT_CLUSTER {
            f.write_str(&self.addr())
        } else {
            write!(f, "{}@{}", self.addr(), self.cluster)
        }
    }
}

/// Whether a service's instances live in memory (ephemeral) or in the store (persistent).
/// Fixed by a service's first instance; registering the other kind is refused (HTTP 409).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Kept alive by a session or a lease, gone when that ends.
    Ephemeral,
    /// Stored durably, probed by the registry, deleted only on request.
    Persistent,
}

impl Kind {
    /// `"ephemeral"` or `"persistent"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Ephemeral => "ephemeral",
            Kind::Persistent => "persistent",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An instance of a service with the fields consumers see.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    /// Identity.
    #[serde(flatten)]
    pub key: InstanceKey,
    /// Share of traffic, 0..=10000, default 1.0; 0 is never picked.
    pub weight: f64,
    /// Manual on/offline; `false` hides the instance from consumers without deleting it.
    pub enabled: bool,
    /// Liveness/probe verdict.
    pub healthy: bool,
    /// Ephemeral (session or lease) or persistent.
    pub ephemeral: bool,
    /// Free string map, at most 64 keys and 16 KiB.
    pub metadata: BTreeMap<String, String>,
}

impl Instance {
    /// A healthy, enabled, ephemeral instance of weight 1.0 and no metadata.
    pub fn new(key: InstanceKey) -> Self {
        Self {
            key,
            weight: DEFAULT_WEIGHT,
            enabled: true,
            healthy: true,
            ephemeral: true,
            metadata: BTreeMap::new(),
        }
    }

    /// Serving: enabled, healthy and weight > 0 — what a consumer view holds normally.
    pub fn is_serving(&self) -> bool {
        self.enabled && self.healthy && self.weight > 0.0
    }

    /// Its state, the first that applies: `offline` (not enabled), `unhealthy`, `zero_weight`,
    /// else `serving`: the `state` label of `gangway_instances` and of the REST listings.
    pub fn state_name(&self) -> &'static str {
        if !self.enabled {
            "offline"
        } else if !self.healthy {
            "unhealthy"
        } else if self.weight <= 0.0 {
            "zero_weight"
        } else {
            "serving"
        }
    }
}

fn or_default(value: &str, default: &str) -> String {
    if value.is_empty() {
        default.to_owned()
    } else {
        value.to_owned()
    }
}

/// How the registry probes a persistent instance (DESIGN §3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeSpec {
    /// TCP connect (default) or HTTP GET.
    #[serde(default)]
    pub kind: ProbeKind,
    /// For HTTP probes: the path to GET, default `/`. A 2xx/3xx answer is a pass.
    #[serde(default = "default_probe_path")]
    pub path: String,
    /// Time between probes, ms; default 2000.
    #[serde(default = "default_probe_interval_ms")]
    pub interval_ms: u64,
    /// Consecutive failures that make a healthy instance unhealthy; default 2.
    #[serde(default = "default_probe_count")]
    pub fall: u32,
    /// Consecutive passes that make an unhealthy instance healthy; default 2.
    #[serde(default = "default_probe_count")]
    pub rise: u32,
}

impl Default for ProbeSpec {
    fn default() -> Self {
        Self {
            kind: ProbeKind::Tcp,
            path: default_probe_path(),
            interval_ms: default_probe_interval_ms(),
            fall: default_probe_count(),
            rise: default_probe_count(),
        }
    }
}

/// Probe type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeKind {
    /// A TCP connect within the interval is a pass.
    #[default]
    Tcp,
    /// An HTTP GET answered 200-399 within the interval is a pass.
    Http,
}

fn default_probe_path() -> String {
    "/".to_owned()
}
fn default_probe_interval_ms() -> u64 {
    2000
}
fn default_probe_count() -> u32 {
    2
}

/// Per-service settings, stored durably.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ServiceSettings {
    /// Protect threshold, ratio 0..=1, default 0 (fires only when no instance is healthy).
    #[serde(default)]
    pub protect_threshold: f64,
    /// Free string map, same limits as instance metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// A persistent instance as stored: its fields and how it is probed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredInstance {
    /// The instance (its `healthy` flag is not authoritative after a restart: probes decide).
    pub instance: Instance,
    /// Probe settings.
    pub probe: ProbeSpec,
    /// The principal that registered it (docs/security.md, "Ownership survives a restart"):
    /// it may always take it out, others need `admin`. `None`: unowned (no auth, or a record
    /// written before owners were stored, which loads as unowned). Omitted from the stored
    /// JSON when `None`, so records without it stay readable both ways.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// A durable manual-offline mark, keyed by (service, ip, port, cluster), not by connection
/// (issue #2): it outlives session reconnects and registry restarts until `online` clears it
/// or the instance has been gone for the mark's expiry (default 10 min).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfflineMark {
    /// Unix time in ms when the mark was set.
    pub since_ms: u64,
}
