//! The Nacos JSON shapes (`Instance`, `ServiceInfo`) and the pure rules that fill them: grouped
//! names, instance ids, Nacos's list selection with its protect threshold, metadata parsing.

use std::collections::BTreeMap;
use std::time::Duration;

use gangway_core::model::{DEFAULT_GROUP, Instance, ServiceKey};
use gangway_core::validate::{self, MAX_LEASE, ValidationError};
use serde::Serialize;

use crate::engine::{Entry, Liveness};

/// `cacheMillis` in every ServiceInfo (Nacos's `defaultPushCacheMillis`): v1 clients poll at it.
pub const CACHE_MILLIS: u64 = 10_000;
/// Nacos's separator between group and service in a grouped name.
pub const GROUP_SEPARATOR: &str = "@@";
/// Default heartbeat interval reported to clients, ms (Nacos: 5000).
pub const DEFAULT_BEAT_INTERVAL_MS: u64 = 5_000;
/// Metadata key for a client-chosen heartbeat interval, ms.
pub const META_BEAT_INTERVAL: &str = "preserved.heart.beat.interval";
/// Metadata key for a client-chosen heartbeat timeout (our lease TTL), ms.
pub const META_BEAT_TIMEOUT: &str = "preserved.heart.beat.timeout";
/// Metadata key for a client-chosen delete timeout, ms.
pub const META_DELETE_TIMEOUT: &str = "preserved.ip.delete.timeout";

/// Splits `group@@service`; a plain name takes `group` (or `DEFAULT_GROUP` when empty).
pub fn split_grouped(name: &str, group: Option<&str>) -> (String, String) {
    match name.split_once(GROUP_SEPARATOR) {
        Some((g, s)) => (g.to_owned(), s.to_owned()),
        None => (
            group
                .filter(|g| !g.is_empty())
                .unwrap_or(DEFAULT_GROUP)
                .to_owned(),
            name.to_owned(),
        ),
    }
}

/// The service a Nacos request names: `name` plain (then in `group`, `DEFAULT_GROUP` when
/// absent or empty) or grouped (`group@@service`), in `namespace` (empty: `public`), checked by
/// [`validate::service_key`]. A grouped name with an empty group (`@@svc`) is refused (field
/// `group`) rather than put in `DEFAULT_GROUP`, as Nacos refuses it
/// (`NamingUtils.checkServiceNameFormat`: "groupName can't be empty").
pub fn service_key(
    namespace: &str,
    name: &str,
    group: Option<&str>,
) -> Result<ServiceKey, ValidationError> {
    if name.starts_with(GROUP_SEPARATOR) {
        return Err(ValidationError::new(
            "group",
            format!("must not be empty in a grouped serviceName (group@@service), got {name:?}"),
        ));
    }
    let (group, service) = split_grouped(name, group);
    let key = ServiceKey::new(namespace, &group, &service);
    validate::service_key(&key)?;
    Ok(key)
}

/// `group@@service`.
pub fn grouped(key: &ServiceKey) -> String {
    format!("{}{GROUP_SEPARATOR}{}", key.group, key.service)
}

/// Nacos's default instance id: `ip#port#cluster#group@@service`.
pub fn instance_id(service: &ServiceKey, i: &Instance) -> String {
    format!(
        "{}#{}#{}#{}",
        i.key.ip,
        i.key.port,
        i.key.cluster,
        grouped(service)
    )
}

/// An instance as Nacos serialises it.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NacosInstance {
    /// `ip#port#cluster#group@@service`.
    pub instance_id: String,
    /// IP.
    pub ip: String,
    /// Port.
    pub port: u16,
    /// Weight.
    pub weight: f64,
    /// Health flag (rewritten to true when the protect threshold fired, as Nacos does).
    pub healthy: bool,
    /// Enabled (always true in lists: disabled instances are not listed).
    pub enabled: bool,
    /// Ephemeral.
    pub ephemeral: bool,
    /// Cluster.
    pub cluster_name: String,
    /// Grouped service name.
    pub service_name: String,
    /// Metadata.
    pub metadata: BTreeMap<String, String>,
    /// Heartbeat interval the client should use, ms.
    pub instance_heart_beat_interval: u64,
    /// Unhealthy after this long without a heartbeat, ms.
    pub instance_heart_beat_time_out: u64,
    /// Deleted after this long without a heartbeat, ms.
    pub ip_delete_timeout: u64,
    /// Always `simple`.
    pub instance_id_generator: &'static str,
}

/// A `ServiceInfo` as Nacos serialises it (v1 list, gRPC query/subscribe responses and pushes).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceInfo {
    /// Grouped (`group@@svc`) in v1 responses, bare in gRPC ones.
    pub name: String,
    /// Group.
    pub group_name: String,
    /// The cluster filter of the request, echoed (clients key their caches on it).
    pub clusters: String,
    /// Poll period hint, ms.
    pub cache_millis: u64,
    /// Selected instances.
    pub hosts: Vec<NacosInstance>,
    /// Wall-clock ms, strictly increasing per service across responses and pushes.
    pub last_ref_time: u64,
    /// Always empty, as in Nacos 2.x/3.x.
    pub checksum: &'static str,
    /// Always false (2.x spelling).
    #[serde(rename = "allIPs")]
    pub all_ips_2x: bool,
    /// Always false (3.x spelling).
    pub all_ips: bool,
    /// The protect threshold fired.
    pub reach_protection_threshold: bool,
    /// `hosts` is present (always true).
    pub valid: bool,
}

/// The timing a Nacos client chose in an instance's `preserved.*` metadata, checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PreservedTiming {
    /// [`META_BEAT_INTERVAL`]: the heartbeat interval reported to clients.
    pub beat_interval: Option<Duration>,
    /// [`META_BEAT_TIMEOUT`]: the lease TTL of a heartbeat-kept instance.
    pub beat_timeout: Option<Duration>,
    /// [`META_DELETE_TIMEOUT`]: the lease delete timeout of a heartbeat-kept instance.
    pub delete_timeout: Option<Duration>,
}

/// Reads and checks the `preserved.*` timing keys of Nacos instance metadata (absent keys stay
/// `None`). Each present key must be a whole number of ms from 100 to 86400000 (24 h): the
/// bounds of a lease ([`validate::lease_ttl`]); the delete timeout is at least the heartbeat
/// timeout when both are given (gangway's lease rule, [`validate::lease_delete_timeout`]), and
/// the heartbeat interval at most each of them that is given (Nacos
/// `NamingUtils.checkInstanceIsLegal`). Errors name the metadata key.
pub fn preserved_timing(
    metadata: &BTreeMap<String, String>,
) -> Result<PreservedTiming, ValidationError> {
    let read = |key: &str| -> Result<Option<Duration>, ValidationError> {
        let Some(raw) = metadata.get(key) else {
            return Ok(None);
        };
        let ms = raw.trim().parse::<u64>().map_err(|_| {
            ValidationError::new(key, format!("must be a whole number of ms, got {raw:?}"))
        })?;
        let d = Duration::from_millis(ms);
        validate::lease_ttl(d).map_err(|e| ValidationError::new(key, e.message))?;
        Ok(Some(d))
    };
    let timing = PreservedTiming {
        beat_interval: read(META_BEAT_INTERVAL)?,
        beat_timeout: read(META_BEAT_TIMEOUT)?,
        delete_timeout: read(META_DELETE_TIMEOUT)?,
    };
    let inverted = timing
        .beat_timeout
        .zip(timing.delete_timeout)
        .filter(|(timeout, delete)| delete < timeout);
    if let Some((timeout, delete)) = inverted {
        return Err(ValidationError::new(
            META_DELETE_TIMEOUT,
            format!(
                "must be at least {META_BEAT_TIMEOUT} ({} ms), got {}",
                timeout.as_millis(),
                delete.as_millis()
            ),
        ));
    }
    if let Some(interval) = timing.beat_interval {
        let at_most = [timing.beat_timeout, timing.delete_timeout]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(MAX_LEASE);
        if interval > at_most {
            return Err(ValidationError::new(
                META_BEAT_INTERVAL,
                format!(
                    "must be at most {META_BEAT_TIMEOUT} and {META_DELETE_TIMEOUT} ({} ms), got {}",
                    at_most.as_millis(),
                    interval.as_millis()
                ),
            ));
        }
    }
    Ok(timing)
}

/// Lease timing reported for an instance, ms: (beat interval, beat timeout, delete timeout).
pub fn timing(entry: &Entry) -> (u64, u64, u64) {
    let meta = |k: &str| {
        entry
            .instance
            .metadata
            .get(k)
            .and_then(|v| v.parse::<u64>().ok())
    };
    let (timeout, delete) = match &entry.liveness {
        Liveness::Lease(l) => (ms(l.ttl), ms(l.delete_timeout)),
        _ => (15_000, 30_000),
    };
    let interval = meta(META_BEAT_INTERVAL).unwrap_or(beat_interval_for(timeout));
    (interval, timeout, delete)
}

/// The heartbeat interval that keeps a lease of `ttl_ms` alive: a third of it, at most 5 s.
pub fn beat_interval_for(ttl_ms: u64) -> u64 {
    (ttl_ms / 3).clamp(100, DEFAULT_BEAT_INTERVAL_MS)
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// What Nacos lists for a service (`ServiceUtil.selectInstancesWithHealthyProtection`):
/// enabled instances in the requested clusters (all clusters when `clusters` is empty), healthy
/// or not; with `healthy_only`, only the healthy ones (and the threshold never fires, as in
/// Nacos 2.x). When healthy ÷ total <= `threshold`, all of them are returned marked healthy and
/// the second value is true.
pub fn select<'a>(
    entries: impl IntoIterator<Item = &'a Entry>,
    clusters: &[&str],
    healthy_only: bool,
    threshold: f64,
) -> (Vec<&'a Entry>, bool) {
    let mut candidates: Vec<&Entry> = entries
        .into_iter()
        .filter(|e| e.instance.enabled)
        .filter(|e| clusters.is_empty() || clusters.contains(&e.instance.key.cluster.as_str()))
        .collect();
    candidates.sort_by(|a, b| a.instance.key.cmp(&b.instance.key));
    if healthy_only {
        candidates.retain(|e| e.instance.healthy);
        return (candidates, false);
    }
    let healthy = candidates.iter().filter(|e| e.instance.healthy).count();
    let reach = !candidates.is_empty() && (healthy as f64 / candidates.len() as f64) <= threshold;
    (candidates, reach)
}

/// Splits a Nacos cluster list (`a,b`), dropping empty parts.
pub fn cluster_list(clusters: &str) -> Vec<&str> {
    clusters
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

/// Converts a listed entry to its Nacos form.
pub fn nacos_instance(service: &ServiceKey, entry: &Entry, protected: bool) -> NacosInstance {
    let i = &entry.instance;
    let (interval, timeout, delete) = timing(entry);
    NacosInstance {
        instance_id: instance_id(service, i),
        ip: i.key.ip.clone(),
        port: i.key.port,
        weight: i.weight,
        healthy: i.healthy || protected,
        enabled: i.enabled,
        ephemeral: i.ephemeral,
        cluster_name: i.key.cluster.clone(),
        service_name: grouped(service),
        metadata: i.metadata.clone(),
        instance_heart_beat_interval: interval,
        instance_heart_beat_time_out: timeout,
        ip_delete_timeout: delete,
        instance_id_generator: "simple",
    }
}

/// Parses Nacos `metadata`: a JSON object (values that are not strings are written as JSON),
/// or `k=v,k=v`. Blank is empty. Errors with Nacos's message.
pub fn parse_metadata(raw: &str) -> Result<BTreeMap<String, String>, String> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(BTreeMap::new());
    }
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(raw) {
        return Ok(map.into_iter().map(|(k, v)| (k, json_string(v))).collect());
    }
    let mut out = BTreeMap::new();
    for pair in raw.split(',') {
        match pair.split_once('=') {
            Some((k, v)) if !k.is_empty() && !k.contains('=') && !v.contains('=') => {
                out.insert(k.to_owned(), v.to_owned());
            }
            _ => return Err(format!("metadata format incorrect:{raw}")),
        }
    }
    Ok(out)
}

/// A JSON value as a metadata string: strings as they are, anything else as JSON text.
pub fn json_string(v: serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use gangway_core::model::InstanceKey;

    use super::*;

    fn entry(ip: &str, healthy: bool, enabled: bool, cluster: &str) -> Entry {
        let mut instance = Instance::new(InstanceKey::new(ip, 80, cluster));
        instance.healthy = healthy;
        instance.enabled = enabled;
        Entry {
            instance,
            liveness: Liveness::Session("s1".into()),
            owner: None,
            since_ms: 0,
        }
    }

    #[test]
    fn grouped_names_split_and_default() {
        assert_eq!(
            split_grouped("g@@svc", Some("other")),
            ("g".into(), "svc".into())
        );
        assert_eq!(
            split_grouped("svc", None),
            ("DEFAULT_GROUP".into(), "svc".into())
        );
        assert_eq!(
            split_grouped("svc", Some("")),
            ("DEFAULT_GROUP".into(), "svc".into())
        );
        assert_eq!(split_grouped("svc", Some("g")), ("g".into(), "svc".into()));
    }

    #[test]
    fn service_keys_refuse_an_empty_group_and_dot_names() {
        let key = service_key("", "g@@svc", None).unwrap();
        assert_eq!(key, ServiceKey::new("public", "g", "svc"));
        assert_eq!(
            service_key("ns", "svc", Some("")).unwrap(),
            ServiceKey::new("ns", "DEFAULT_GROUP", "svc")
        );
        let err = service_key("", "@@svc", Some("g")).unwrap_err();
        assert_eq!(err.field, "group");
        assert_eq!(
            err.message,
            r#"must not be empty in a grouped serviceName (group@@service), got "@@svc""#
        );
        assert_eq!(service_key("", "g@@", None).unwrap_err().field, "service");
        assert_eq!(
            service_key("", "a@@b@@c", None).unwrap_err().field,
            "service"
        );
        assert_eq!(service_key("", "..", None).unwrap_err().field, "service");
        assert_eq!(service_key("", ".@@svc", None).unwrap_err().field, "group");
    }

    #[test]
    fn preserved_timing_is_bounded_and_consistent() {
        let m = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let ms = Duration::from_millis;
        assert_eq!(preserved_timing(&m(&[])), Ok(PreservedTiming::default()));
        let edges = m(&[
            (META_BEAT_INTERVAL, "100"),
            (META_BEAT_TIMEOUT, "86400000"),
            (META_DELETE_TIMEOUT, "86400000"),
        ]);
        assert_eq!(
            preserved_timing(&edges),
            Ok(PreservedTiming {
                beat_interval: Some(ms(100)),
                beat_timeout: Some(ms(86_400_000)),
                delete_timeout: Some(ms(86_400_000)),
            })
        );
        let field = |pairs: &[(&str, &str)]| preserved_timing(&m(pairs)).unwrap_err().field;
        let max = u64::MAX.to_string();
        for key in [META_BEAT_INTERVAL, META_BEAT_TIMEOUT, META_DELETE_TIMEOUT] {
            assert_eq!(field(&[(key, &max)]), key);
            assert_eq!(field(&[(key, "86400001")]), key);
            assert_eq!(field(&[(key, "99")]), key);
            assert_eq!(field(&[(key, "15s")]), key);
            assert_eq!(field(&[(key, "-1")]), key);
        }
        let err = preserved_timing(&m(&[(META_BEAT_TIMEOUT, &max)])).unwrap_err();
        assert_eq!(
            err.message,
            format!("must be 100-86400000 (24 h), got {max}")
        );
        assert_eq!(
            field(&[(META_BEAT_TIMEOUT, "20000"), (META_DELETE_TIMEOUT, "10000")]),
            META_DELETE_TIMEOUT
        );
        assert_eq!(
            field(&[(META_BEAT_INTERVAL, "20000"), (META_BEAT_TIMEOUT, "15000")]),
            META_BEAT_INTERVAL
        );
        assert_eq!(
            field(&[
                (META_BEAT_INTERVAL, "20000"),
                (META_DELETE_TIMEOUT, "15000")
            ]),
            META_BEAT_INTERVAL
        );
    }

    #[test]
    fn selection_lists_unhealthy_and_skips_disabled_and_other_clusters() {
        let es = [
            entry("10.0.0.1", true, true, "DEFAULT"),
            entry("10.0.0.2", false, true, "DEFAULT"),
            entry("10.0.0.3", true, false, "DEFAULT"),
            entry("10.0.0.4", true, true, "other"),
        ];
        let (picked, reach) = select(&es, &["DEFAULT"], false, 0.0);
        let ips: Vec<&str> = picked.iter().map(|e| e.instance.key.ip.as_str()).collect();
        assert_eq!(ips, ["10.0.0.1", "10.0.0.2"]);
        assert!(!reach);
        let (picked, _) = select(&es, &[], true, 0.0);
        assert_eq!(picked.len(), 2, "healthy, enabled, any cluster");
    }

    #[test]
    fn threshold_fires_at_ratio_and_never_with_healthy_only_or_nothing() {
        let es = [
            entry("10.0.0.1", true, true, "DEFAULT"),
            entry("10.0.0.2", false, true, "DEFAULT"),
        ];
        assert!(select(&es, &[], false, 0.5).1);
        assert!(!select(&es, &[], false, 0.4).1);
        assert!(!select(&es, &[], true, 0.9).1);
        assert!(!select(&[], &[], false, 1.0).1);
        let down = [entry("10.0.0.2", false, true, "DEFAULT")];
        let (picked, reach) = select(&down, &[], false, 0.0);
        assert!(reach, "default threshold 0 fires when none is healthy");
        let key = ServiceKey::named("s");
        assert!(nacos_instance(&key, picked[0], reach).healthy);
    }

    #[test]
    fn metadata_parses_json_and_pairs_and_refuses_garbage() {
        let m = parse_metadata(r#"{"a":"1","b":2}"#).unwrap();
        assert_eq!(m["a"], "1");
        assert_eq!(m["b"], "2");
        let m = parse_metadata("a=1,b=2").unwrap();
        assert_eq!(m["b"], "2");
        assert!(parse_metadata("").unwrap().is_empty());
        assert_eq!(
            parse_metadata(r#"{"a":"#).unwrap_err(),
            r#"metadata format incorrect:{"a":"#
        );
        assert!(parse_metadata("a=1,b").is_err());
    }

    #[test]
    fn instance_json_has_nacos_field_names() {
        let key = ServiceKey::named("svc");
        let e = entry("10.0.0.1", true, true, "DEFAULT");
        let v = serde_json::to_value(nacos_instance(&key, &e, false)).unwrap();
        assert_eq!(v["instanceId"], "10.0.0.1#80#DEFAULT#DEFAULT_GROUP@@svc");
        assert_eq!(v["serviceName"], "DEFAULT_GROUP@@svc");
        assert_eq!(v["instanceHeartBeatTimeOut"], 15000);
        assert_eq!(v["ipDeleteTimeout"], 30000);
        assert_eq!(v["instanceIdGenerator"], "simple");
    }
}
