//! Conversions between `gangway_core` types and the generated protocol types.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use gangway_core::view::View;
use gangway_proto::v1 as pb;

use crate::Error;
use crate::client::{DrainReport, SubscriberAck};

pub(crate) fn service_to_pb(s: &ServiceKey) -> pb::ServiceKey {
    pb::ServiceKey {
        namespace: s.namespace.clone(),
        group: s.group.clone(),
        service: s.service.clone(),
    }
}

pub(crate) fn service_from_pb(s: &pb::ServiceKey) -> ServiceKey {
    ServiceKey::new(&s.namespace, &s.group, &s.service)
}

pub(crate) fn instance_key_to_pb(k: &InstanceKey) -> pb::InstanceKey {
    pb::InstanceKey {
        ip: k.ip.clone(),
        port: u32::from(k.port),
        cluster: k.cluster.clone(),
    }
}

/// `None` when the key is missing or its port does not fit a TCP port.
pub(crate) fn instance_from_pb(i: &pb::Instance) -> Option<Instance> {
    let key = i.key.as_ref()?;
    let port = u16::try_from(key.port).ok()?;
    Some(Instance {
        key: InstanceKey::new(&key.ip, port, &key.cluster),
        weight: i.weight,
        enabled: i.enabled,
        healthy: i.healthy,
        ephemeral: i.ephemeral,
        metadata: i
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    })
}

/// The view a snapshot carries; malformed instances are skipped (and logged).
pub(crate) fn view_from_snapshot(s: &pb::Snapshot) -> View {
    let mut instances: Vec<Instance> = s
        .instances
        .iter()
        .filter_map(|i| {
            let converted = instance_from_pb(i);
            if converted.is_none() {
                tracing::warn!(instance = ?i.key, "skipping malformed instance in snapshot");
            }
            converted
        })
        .collect();
    instances.sort_by(|a, b| a.key.cmp(&b.key));
    View {
        revision: s.revision,
        instances,
        protection_triggered: s.protection_triggered,
    }
}

/// `held` with a delta applied (see `Snapshot` in gangway.proto): the removed and the
/// upserted keys leave, the upserted instances come in as they are now. The caller checks that
/// the delta applies to the revision `held` is at.
pub(crate) fn apply_delta(held: &View, delta: &pb::Snapshot) -> View {
    let upserted = view_from_snapshot(delta).instances;
    let gone: std::collections::BTreeSet<InstanceKey> = delta
        .removed
        .iter()
        .filter_map(|k| {
            Some(InstanceKey::new(
                &k.ip,
                u16::try_from(k.port).ok()?,
                &k.cluster,
            ))
        })
        .chain(upserted.iter().map(|i| i.key.clone()))
        .collect();
    let mut instances: Vec<Instance> = held
        .instances
        .iter()
        .filter(|i| !gone.contains(&i.key))
        .cloned()
        .chain(upserted)
        .collect();
    instances.sort_by(|a, b| a.key.cmp(&b.key));
    View {
        revision: delta.revision,
        instances,
        protection_triggered: delta.protection_triggered,
    }
}

pub(crate) fn metadata_to_pb(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// `Ok(reply)` when `error_code` is empty, [`Error::Rejected`] otherwise.
pub(crate) fn check_reply(reply: pb::Reply) -> Result<pb::Reply, Error> {
    if reply.error_code.is_empty() {
        Ok(reply)
    } else {
        Err(Error::Rejected {
            code: reply.error_code,
            message: reply.error_message,
            field: (!reply.error_field.is_empty()).then_some(reply.error_field),
        })
    }
}

fn ack_from_pb(a: pb::SubscriberAck) -> SubscriberAck {
    SubscriberAck {
        id: a.id,
        address: a.address,
        acked_revision: a.acked_revision,
    }
}

pub(crate) fn drain_from_pb(d: pb::DrainResult) -> DrainReport {
    DrainReport {
        revision: d.revision,
        waited: Duration::from_millis(d.waited_ms),
        complete: d.complete,
        acked: d.acked.into_iter().map(ack_from_pb).collect(),
        laggards: d.laggards.into_iter().map(ack_from_pb).collect(),
        notes: d.notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_instances_are_skipped_and_the_rest_sorted() {
        let inst = |ip: &str, port: u32| pb::Instance {
            key: Some(pb::InstanceKey {
                ip: ip.into(),
                port,
                cluster: String::new(),
            }),
            weight: 1.0,
            enabled: true,
            healthy: true,
            ephemeral: true,
            metadata: HashMap::new(),
        };
        let snap = pb::Snapshot {
            service: None,
            revision: 4,
            instances: vec![
                inst("10.0.0.2", 80),
                inst("10.0.0.1", 70_000),
                inst("10.0.0.1", 80),
            ],
            protection_triggered: true,
            request_id: 0,
            ..Default::default()
        };
        let view = view_from_snapshot(&snap);
        assert_eq!(view.revision, 4);
        assert!(view.protection_triggered);
        let ips: Vec<_> = view.instances.iter().map(|i| i.key.addr()).collect();
        assert_eq!(ips, ["10.0.0.1:80", "10.0.0.2:80"]);
        assert_eq!(view.instances[0].key.cluster, "DEFAULT");
    }

    #[test]
    fn a_delta_replaces_what_changed_and_drops_what_left() {
        let inst = |ip: &str, weight: f64| pb::Instance {
            key: Some(pb::InstanceKey {
                ip: ip.into(),
                port: 80,
                cluster: String::new(),
            }),
            weight,
            enabled: true,
            healthy: true,
            ephemeral: true,
            metadata: HashMap::new(),
        };
        let held = view_from_snapshot(&pb::Snapshot {
            revision: 5,
            instances: vec![
                inst("10.0.0.1", 1.0),
                inst("10.0.0.2", 1.0),
                inst("10.0.0.3", 1.0),
            ],
            ..Default::default()
        });
        let delta = pb::Snapshot {
            revision: 7,
            base_revision: 4,
            delta: true,
            instances: vec![inst("10.0.0.2", 5.0), inst("10.0.0.4", 1.0)],
            removed: vec![pb::InstanceKey {
                ip: "10.0.0.3".into(),
                port: 80,
                cluster: "DEFAULT".into(),
            }],
            ..Default::default()
        };
        let view = apply_delta(&held, &delta);
        assert_eq!(view.revision, 7);
        let got: Vec<_> = view
            .instances
            .iter()
            .map(|i| (i.key.ip.as_str(), i.weight))
            .collect();
        assert_eq!(
            got,
            [("10.0.0.1", 1.0), ("10.0.0.2", 5.0), ("10.0.0.4", 1.0)]
        );
    }

    #[test]
    fn reply_errors_become_rejected() {
        let ok = pb::Reply {
            request_id: 1,
            revision: 9,
            ..Default::default()
        };
        assert_eq!(check_reply(ok).unwrap().revision, 9);
        let bad = pb::Reply {
            request_id: 1,
            error_code: "conflict".into(),
            error_message: "kind".into(),
            ..Default::default()
        };
        assert_eq!(
            check_reply(bad).unwrap_err(),
            Error::Rejected {
                code: "conflict".into(),
                message: "kind".into(),
                field: None
            }
        );
    }
}
