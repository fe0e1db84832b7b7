//! The REST/JSON API's request and response bodies (docs/api.md, `/v1/openapi.json`): what the
//! server's handlers send and parse, and what the [client](crate::client) reads.
//!
//! Answers are read leniently (a field a registry leaves out takes its default where one makes
//! sense) and request bodies strictly (`deny_unknown_fields`, as the server parses them).
//! Optional request fields left `None` are not sent: the registry's defaults apply.

use std::collections::BTreeMap;

use gangway_core::model::{Instance as DomainInstance, InstanceKey, Kind, ProbeKind, ProbeSpec};
use gangway_core::view::View as DomainView;
use serde::{Deserialize, Deserializer, Serialize};

pub use gangway_core::drain::{DrainReport, SubscriberAck};

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `UP`, or `LOADING` (with HTTP 503) while the registry reads its store at start.
    pub status: String,
    /// Changes on every start of the registry (hex of its boot time in µs).
    pub boot_id: String,
    /// True while snapshots are held back after a start or a stall.
    #[serde(default)]
    pub warming_up: bool,
    /// True while the store is read at start (then the answer is a 503); absent from older
    /// registries, read as false.
    #[serde(default)]
    pub loading: bool,
    /// `on` when the registry checks credentials (`--auth`), `off` when it does not (then it
    /// listens on loopback only); empty from older registries.
    #[serde(default)]
    pub auth: String,
    /// `off`, `on` when both ports speak TLS (`--tls-cert`), `mutual` when they also require a
    /// client certificate (`--tls-client-ca`); empty from older registries.
    #[serde(default)]
    pub tls: String,
    /// With `--store etcd`: this node's etcd lease (docs/cluster.md); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_lease: Option<NodeLease>,
}

/// A node's etcd lease, as `/v1/health` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLease {
    /// The etcd lease id, 16 hex digits (as `etcdctl lease list` shows it).
    pub id: String,
    /// `alive` (renewed every TTL/3) or `lost` (expired, or not renewed within its TTL).
    pub state: String,
    /// TTL granted, seconds.
    pub ttl_s: i64,
    /// Renewals answered since the grant (the grant counts as one).
    #[serde(default)]
    pub renewals: u64,
    /// Why it was lost; absent while alive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `GET /v1/cluster` (docs/cluster.md): the nodes as the answering node sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// `cluster`, or `single` for a node alone (then `nodes` is empty).
    pub mode: String,
    /// The answering node's name (cluster mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The newest store (etcd) revision the answering node applied (cluster mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// Every node, the answering one first, then by name.
    pub nodes: Vec<ClusterNode>,
}

/// One node of [`ClusterView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterNode {
    /// Its name (`--node-name`).
    pub name: String,
    /// Its REST address.
    pub http: String,
    /// Its gRPC address.
    pub grpc: String,
    /// Its etcd lease, 16 hex digits.
    pub lease: String,
    /// Unix ms when it started.
    pub started_ms: u64,
    /// Its open sessions (another node's: as of its last record, at most 2 s old).
    pub sessions: usize,
    /// Its live subscribers (likewise).
    pub subscribers: usize,
    /// The answering node.
    pub this: bool,
}

/// One service: `GET /v1/services/{service}`, each entry of [`ServiceList`], the answer of
/// `PUT /v1/services/{service}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Service {
    /// Namespace.
    pub namespace: String,
    /// Group.
    pub group: String,
    /// Service name.
    pub service: String,
    /// Fixed by the instances held; `None` (JSON `null`) while it holds none.
    #[serde(default)]
    pub kind: Option<Kind>,
    /// Current revision (grows on every change).
    #[serde(default)]
    pub revision: u64,
    /// Instances, whatever their state.
    #[serde(default)]
    pub instances: u64,
    /// Instances in the consumer view.
    #[serde(default)]
    pub serving: u64,
    /// Live subscribers.
    #[serde(default)]
    pub subscribers: u64,
    /// Instances by state (as `gangway_instances{state}` counts them; they add up to
    /// `instances`).
    #[serde(default)]
    pub states: StateCounts,
    /// Protect threshold, ratio 0..=1.
    #[serde(default)]
    pub protect_threshold: f64,
    /// The service's metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// A service's instances by state; the four add up to its instances.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateCounts {
    /// Enabled, healthy, weight above 0: in the consumer view.
    pub serving: u64,
    /// Enabled but failing its lease, session or probe.
    pub unhealthy: u64,
    /// Disabled (offline, or drained).
    pub offline: u64,
    /// Enabled and healthy with weight 0: listed, sent no traffic.
    pub zero_weight: u64,
}

/// `GET /v1/services`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceList {
    /// The services, sorted by namespace, group, name.
    pub services: Vec<Service>,
}

/// Body of `PUT /v1/services/{service}`: the settings to change; `None` keeps the current one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingsRequest {
    /// Protect threshold, ratio 0..=1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protect_threshold: Option<f64>,
    /// Replaces the service's metadata (at most 64 keys, 16 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// An instance as REST shows it: its fields and, in views and snapshots, who keeps it alive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    /// IP literal (IPv6 without brackets) or host name.
    pub ip: String,
    /// TCP port.
    pub port: u16,
    /// Cluster.
    #[serde(default)]
    pub cluster: String,
    /// Share of traffic, 0..=10000; 0 is never picked.
    pub weight: f64,
    /// Manual on/offline.
    pub enabled: bool,
    /// Liveness or probe verdict.
    pub healthy: bool,
    /// Ephemeral (session or lease) or persistent (probed).
    pub ephemeral: bool,
    /// Free string map.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Who keeps it alive: `session`, `lease`, `probe` or `grace`. Views and snapshots say;
    /// the answers of register, patch, offline and online do not (`None`, not sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<String>,
}

/// A consumer view: `GET .../instances` (`?all=true`: every instance) and each `watch` snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct View {
    /// Namespace.
    #[serde(default)]
    pub namespace: String,
    /// Group.
    #[serde(default)]
    pub group: String,
    /// Service name.
    #[serde(default)]
    pub service: String,
    /// Service revision the view is at (0: unknown service).
    pub revision: u64,
    /// The protect threshold put unhealthy instances back in.
    #[serde(default)]
    pub protection_triggered: bool,
    /// The registry is still warming up after a start.
    #[serde(default)]
    pub warming_up: bool,
    /// The instances, sorted by ip, port, cluster.
    #[serde(default)]
    pub instances: Vec<Instance>,
}

/// Body of `POST /v1/services/{service}/instances`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    /// IP literal or host name.
    pub ip: String,
    /// TCP port, 1-65535 (wider here so the registry can name a bad one).
    pub port: u32,
    /// Cluster; registry default `DEFAULT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Weight; registry default 1.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
    /// Metadata (at most 64 keys, 16 KiB); empty is not sent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Ephemeral (lease-kept) or persistent (stored, probed); default: ephemeral unless a
    /// `probe` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<bool>,
    /// Registered offline when `Some(false)`; default online.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Ephemeral only: unhealthy after this long without a heartbeat, ms (registry default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// Ephemeral only: deleted after this long without a heartbeat, ms (registry default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_timeout_ms: Option<u64>,
    /// Persistent only: how the registry probes it (registry default: TCP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeRequest>,
}

/// How a persistent instance is probed; unset fields take [`ProbeSpec::default`]'s.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeRequest {
    /// TCP connect (default) or HTTP GET.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ProbeKind>,
    /// HTTP probes: the path to GET (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Time between probes, ms (default 2000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
    /// Consecutive failures that make it unhealthy (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fall: Option<u32>,
    /// Consecutive passes that make it healthy again (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rise: Option<u32>,
}

/// Body of `PATCH /v1/services/{service}/instances/{addr}`: what to change.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchRequest {
    /// New weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
    /// Replaces the metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Online or offline (with the durable mark, as the offline/online calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Apply even when it takes the last instance out of the consumer view.
    #[serde(default)]
    pub force: bool,
}

/// Body of `POST .../instances/{addr}/offline` (optional: none is `force: false`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfflineRequest {
    /// Take it out even when it is the last serving instance.
    #[serde(default)]
    pub force: bool,
}

/// Body of `POST .../instances/{addr}/online` (optional: none is online without waiting).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnlineRequest {
    /// Answer with a readiness [`DrainReport`] once every live subscriber acked a revision
    /// holding the instance, instead of the [`InstanceChange`].
    #[serde(default)]
    pub wait: bool,
    /// With `wait`: longest wait for acks, ms (registry default: its drain timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// Body of `POST .../instances/{addr}/drain` (optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// Longest wait for acks, ms (registry default: its drain timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Drain even the last serving instance.
    #[serde(default)]
    pub force: bool,
}

/// Answer of register, patch, offline and online (without `wait`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceChange {
    /// Revision after the change.
    pub revision: u64,
    /// The instance as it now is (without [`Instance::liveness`]).
    pub instance: Instance,
}

/// Answer of deregister.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revision {
    /// Revision after the change.
    pub revision: u64,
}

/// Answer of `PUT .../instances/{addr}/heartbeat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatAnswer {
    /// The lease TTL, ms: send the next heartbeat within a third of it.
    pub ttl_ms: u64,
    /// Whether the instance is healthy now.
    pub healthy: bool,
}

/// `GET /v1/services/{service}/subscribers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subscribers {
    /// Current revision of the service.
    pub revision: u64,
    /// Who follows the service.
    #[serde(default)]
    pub subscribers: Vec<Subscriber>,
}

/// One subscriber of a service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subscriber {
    /// Subscriber id: `sub<N>` (session), `w<N>` (watch), `p-NAME` (poller); a number is
    /// read as its decimal text.
    #[serde(deserialize_with = "string_or_number")]
    pub id: String,
    /// Its remote `ip:port`.
    #[serde(default)]
    pub address: String,
    /// `session`, `watch` or `poller`.
    #[serde(default)]
    pub kind: String,
    /// The name the client gave; empty or `None` when it gave none.
    #[serde(default)]
    pub client_name: Option<String>,
    /// Newest revision it acked (0: none yet).
    #[serde(default)]
    pub acked_revision: u64,
    /// When it acked last, Unix ms; `None` before its first ack.
    #[serde(default)]
    pub acked_at_ms: Option<u64>,
    /// Newest revision pushed to it (`None` when the registry did not say).
    #[serde(default)]
    pub pushed_revision: Option<u64>,
    /// Revisions published since the one it acked (0: up to date; a subscriber further behind
    /// than the registry's change log counts as its length).
    #[serde(default)]
    pub behind: u64,
    /// Time since the oldest revision it has not acked was published, in ms; `None` (JSON
    /// `null`) when it is up to date.
    #[serde(default)]
    pub lag_ms: Option<u64>,
}

impl Instance {
    /// `ip:port`, IPv6 in brackets (`[fd00::7]:80`).
    pub fn addr(&self) -> String {
        self.key().addr()
    }

    /// Its identity (an empty cluster is the default one).
    pub fn key(&self) -> InstanceKey {
        InstanceKey::new(&self.ip, self.port, &self.cluster)
    }

    /// `instance` as REST shows it, with who keeps it alive when the answer tells.
    pub fn from_domain(instance: DomainInstance, liveness: Option<&str>) -> Self {
        let DomainInstance {
            key,
            weight,
            enabled,
            healthy,
            ephemeral,
            metadata,
        } = instance;
        Self {
            ip: key.ip,
            port: key.port,
            cluster: key.cluster,
            weight,
            enabled,
            healthy,
            ephemeral,
            metadata,
            liveness: liveness.map(str::to_owned),
        }
    }
}

impl From<DomainInstance> for Instance {
    /// Without [`Instance::liveness`].
    fn from(instance: DomainInstance) -> Self {
        Instance::from_domain(instance, None)
    }
}

impl From<Instance> for DomainInstance {
    /// Drops [`Instance::liveness`]; an empty cluster is the default one.
    fn from(i: Instance) -> Self {
        DomainInstance {
            key: InstanceKey::new(&i.ip, i.port, &i.cluster),
            weight: i.weight,
            enabled: i.enabled,
            healthy: i.healthy,
            ephemeral: i.ephemeral,
            metadata: i.metadata,
        }
    }
}

impl From<View> for DomainView {
    /// The revision, the protection flag and the instances (in the order sent).
    fn from(v: View) -> Self {
        DomainView {
            revision: v.revision,
            instances: v.instances.into_iter().map(Into::into).collect(),
            protection_triggered: v.protection_triggered,
        }
    }
}

impl ProbeRequest {
    /// The probe settings, unset fields taken from [`ProbeSpec::default`].
    pub fn spec(self) -> ProbeSpec {
        let d = ProbeSpec::default();
        ProbeSpec {
            kind: self.kind.unwrap_or(d.kind),
            path: self.path.unwrap_or(d.path),
            interval_ms: self.interval_ms.unwrap_or(d.interval_ms),
            fall: self.fall.unwrap_or(d.fall),
            rise: self.rise.unwrap_or(d.rise),
        }
    }
}

/// A subscriber id sent as a string or, by some registries, as a number.
fn string_or_number<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct Id;
    impl serde::de::Visitor<'_> for Id {
        type Value = String;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string or a number")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_owned())
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }
    d.deserialize_any(Id)
}

#[cfg(test)]
mod tests;
