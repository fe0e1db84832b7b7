//! The key layout (docs/cluster.md, "Key layout"), version 1. Under the prefix `P`
//! (`--etcd-prefix`, default `/gangway`):
//!
//! | key | value (JSON) |
//! |---|---|
//! | `P/v1/instances/{ns}/{group}/{service}/{ip}:{port}#{cluster}` | `StoredInstance` (instance, probe, owner) |
//! | `P/v1/services/{ns}/{group}/{service}` | `ServiceSettings` |
//! | `P/v1/offline/{ns}/{group}/{service}/{ip}:{port}#{cluster}` | `OfflineMark` |
//! | `P/v1/ephemeral/{ns}/{group}/{service}/{ip}:{port}#{cluster}` | `EphemeralRecord`, bound to the holding node's lease |
//! | `P/v1/revisions/{ns}/{group}/{service}` | `{"node": writer}`, written by every transaction that changes the service |
//! | `P/v1/nodes/{name}` | `NodeRecord`, bound to the node's lease |
//! | `P/v1/drains/{id}` | `DrainRecord`, bound to the draining node's lease |
//! | `P/v1/drains/{id}/{node}` | `DrainAnswer`, bound to the answering node's lease |
//! | `P/v1/locks/{ns}/{group}/{service}` | the holding node's name, bound to its lease |
//!
//! Each name segment is percent-encoded for `%`, `/` and `#` (and nothing else), so a key
//! splits back unambiguously: segments on `/`, the cluster after the last `#`, the port after
//! the last `:` before it (an IPv6 address keeps its colons: `::1:8080#DEFAULT`). Values are the
//! same JSON as the embedded store writes, so a field added later loads with its default.

use gangway_core::model::{InstanceKey, ServiceKey};

/// Version segment of the layout; a future incompatible layout gets `v2` beside it.
pub const VERSION: &str = "v1";

/// The key spaces: three of durable state, four of cluster mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// Persistent instances.
    Instances,
    /// Service settings.
    Services,
    /// Manual-offline marks.
    Offline,
    /// Ephemeral instances (cluster mode), bound to node leases.
    Ephemeral,
    /// Per-service revision marks naming the writing node (cluster mode).
    Revisions,
    /// Node records (cluster mode).
    Nodes,
    /// Drains across nodes and their answers (cluster mode).
    Drains,
    /// Per-service locks of the changes whose rule must hold across nodes (cluster mode).
    Locks,
}

impl Space {
    /// The spaces of durable state, in the order `load` reads them.
    pub const DURABLE: [Space; 3] = [Space::Instances, Space::Services, Space::Offline];
    /// Every space.
    pub const ALL: [Space; 8] = [
        Space::Instances,
        Space::Services,
        Space::Offline,
        Space::Ephemeral,
        Space::Revisions,
        Space::Nodes,
        Space::Drains,
        Space::Locks,
    ];

    /// The path segment of the space.
    pub fn segment(self) -> &'static str {
        match self {
            Space::Instances => "instances",
            Space::Services => "services",
            Space::Offline => "offline",
            Space::Ephemeral => "ephemeral",
            Space::Revisions => "revisions",
            Space::Nodes => "nodes",
            Space::Drains => "drains",
            Space::Locks => "locks",
        }
    }
}

/// Builds and parses keys under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    prefix: String,
}

impl Layout {
    /// The layout under `prefix` (checked by [`crate::EtcdConfig`]: starts with `/`, no
    /// trailing `/`).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    /// `P/v1/`: every key of this layout starts with it (the prefix a watch covers).
    pub fn root(&self) -> String {
        format!("{}/{VERSION}/", self.prefix)
    }

    /// The space a key of this layout belongs to; `None` for a key outside them (a later key
    /// space, another prefix).
    pub fn space_of(&self, key: &str) -> Option<Space> {
        Space::ALL
            .into_iter()
            .find(|s| key.starts_with(&self.space(*s)))
    }

    /// `P/v1/{space}/`: every key of `space` starts with it.
    pub fn space(&self, space: Space) -> String {
        format!("{}/{VERSION}/{}/", self.prefix, space.segment())
    }

    /// Key of a service's settings.
    pub fn service(&self, service: &ServiceKey) -> String {
        format!("{}{}", self.space(Space::Services), service_path(service))
    }

    /// Key of a service's revision mark.
    pub fn revision(&self, service: &ServiceKey) -> String {
        format!("{}{}", self.space(Space::Revisions), service_path(service))
    }

    /// Key of a service's lock.
    pub fn lock(&self, service: &ServiceKey) -> String {
        format!("{}{}", self.space(Space::Locks), service_path(service))
    }

    /// Key of a node record.
    pub fn node(&self, name: &str) -> String {
        format!("{}{}", self.space(Space::Nodes), encode(name))
    }

    /// Key of a drain record (`node` `None`), or of `node`'s answer to it.
    pub fn drain(&self, id: &str, node: Option<&str>) -> String {
        match node {
            None => format!("{}{}", self.space(Space::Drains), encode(id)),
            Some(node) => format!(
                "{}{}/{}",
                self.space(Space::Drains),
                encode(id),
                encode(node)
            ),
        }
    }

    /// The node name of a node key.
    pub fn parse_node(&self, key: &str) -> Option<String> {
        decode(key.strip_prefix(&self.space(Space::Nodes))?)
    }

    /// The drain id, and the answering node for an answer key, of a drain key.
    pub fn parse_drain(&self, key: &str) -> Option<(String, Option<String>)> {
        let rest = key.strip_prefix(&self.space(Space::Drains))?;
        match rest.split_once('/') {
            None => Some((decode(rest)?, None)),
            Some((id, node)) => Some((decode(id)?, Some(decode(node)?))),
        }
    }

    /// Key of an instance (space [`Space::Instances`] or [`Space::Ephemeral`]) or of its
    /// offline mark ([`Space::Offline`]).
    pub fn instance(&self, space: Space, service: &ServiceKey, key: &InstanceKey) -> String {
        format!(
            "{}{}/{}:{}#{}",
            self.space(space),
            service_path(service),
            encode(&key.ip),
            key.port,
            encode(&key.cluster)
        )
    }

    /// The service of a key of [`Space::Services`] (or, with [`parse_service_in`], of
    /// [`Space::Revisions`]); `None` when the key is not one.
    ///
    /// [`parse_service_in`]: Self::parse_service_in
    pub fn parse_service(&self, key: &str) -> Option<ServiceKey> {
        self.parse_service_in(Space::Services, key)
    }

    /// The service of a key of `space` ([`Space::Services`] or [`Space::Revisions`]).
    pub fn parse_service_in(&self, space: Space, key: &str) -> Option<ServiceKey> {
        let rest = key.strip_prefix(&self.space(space))?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts[..] {
            [ns, group, service] => Some(ServiceKey {
                namespace: decode(ns)?,
                group: decode(group)?,
                service: decode(service)?,
            }),
            _ => None,
        }
    }

    /// The service and instance key of a key of `space` (instances or offline marks); `None`
    /// when the key is not one.
    pub fn parse_instance(&self, space: Space, key: &str) -> Option<(ServiceKey, InstanceKey)> {
        let rest = key.strip_prefix(&self.space(space))?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [ns, group, service, instance] = parts[..] else {
            return None;
        };
        let (addr, cluster) = instance.rsplit_once('#')?;
        let (ip, port) = addr.rsplit_once(':')?;
        Some((
            ServiceKey {
                namespace: decode(ns)?,
                group: decode(group)?,
                service: decode(service)?,
            },
            InstanceKey {
                ip: decode(ip)?,
                port: port.parse().ok()?,
                cluster: decode(cluster)?,
            },
        ))
    }
}

fn service_path(service: &ServiceKey) -> String {
    format!(
        "{}/{}/{}",
        encode(&service.namespace),
        encode(&service.group),
        encode(&service.service)
    )
}

/// Percent-encodes `%`, `/` and `#`.
fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for c in segment.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
    }
    out
}

/// Reverses [`encode`]; `None` for an escape it never writes.
fn decode(segment: &str) -> Option<String> {
    let mut out = String::with_capacity(segment.len());
    let mut rest = segment;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let escape = rest.get(at..at + 3)?;
        out.push(match escape {
            "%25" => '%',
            "%2F" => '/',
            "%23" => '#',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_documented_layout_and_parse_back() {
        let layout = Layout::new("/gangway");
        let svc = ServiceKey::new("public", "DEFAULT_GROUP", "orders");
        let key = InstanceKey::new("10.0.0.1", 8080, "");
        let k = layout.instance(Space::Instances, &svc, &key);
        assert_eq!(
            k,
            "/gangway/v1/instances/public/DEFAULT_GROUP/orders/10.0.0.1:8080#DEFAULT"
        );
        assert_eq!(
            layout.parse_instance(Space::Instances, &k),
            Some((svc.clone(), key.clone()))
        );
        assert_eq!(
            layout.instance(Space::Offline, &svc, &key),
            "/gangway/v1/offline/public/DEFAULT_GROUP/orders/10.0.0.1:8080#DEFAULT"
        );
        let s = layout.service(&svc);
        assert_eq!(s, "/gangway/v1/services/public/DEFAULT_GROUP/orders");
        assert_eq!(layout.parse_service(&s), Some(svc));
    }

    #[test]
    fn awkward_names_round_trip_and_foreign_keys_do_not_parse() {
        let layout = Layout::new("/x/y");
        let svc = ServiceKey::new("n/s", "g#1", "a%2Fb");
        let key = InstanceKey::new("::1", 80, "c/#%");
        let k = layout.instance(Space::Offline, &svc, &key);
        assert_eq!(k, "/x/y/v1/offline/n%2Fs/g%231/a%252Fb/::1:80#c%2F%23%25");
        assert_eq!(
            layout.parse_instance(Space::Offline, &k),
            Some((svc.clone(), key))
        );
        assert_eq!(layout.parse_instance(Space::Instances, &k), None);
        let s = layout.service(&svc);
        assert_eq!(layout.parse_service(&s), Some(svc));
        for bad in [
            "/x/y/v1/services/a/b",
            "/x/y/v1/services/a/b/c/d",
            "/x/y/v1/services/a/b/%41",
            "/x/y/v1/services/a/b/%2",
        ] {
            assert_eq!(layout.parse_service(bad), None, "{bad}");
        }
        for bad in [
            "/x/y/v1/instances/a/b/c/1.2.3.4:80",
            "/x/y/v1/instances/a/b/c/1.2.3.4#D",
            "/x/y/v1/instances/a/b/c/1.2.3.4:99999#D",
        ] {
            assert_eq!(layout.parse_instance(Space::Instances, bad), None, "{bad}");
        }
    }
}
