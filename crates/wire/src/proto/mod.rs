//! Conversions between the domain (`gangway_core`) and the native protocol's messages
//! (`gangway_proto::v1`), for the server's session service, the Rust client and the bench.
//!
//! Keys coming in take their defaults (an empty namespace is `public`, ...); a port that does
//! not fit a TCP port is refused with the field `port`, as the REST API refuses it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gangway_core::ValidationError;
use gangway_core::drain::{DrainReport, SubscriberAck};
use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use gangway_core::view::View;
use gangway_proto::v1 as pb;

use crate::error::{ErrorCode, ErrorDetail};

/// A service key as the protocol carries it.
pub fn service_to_pb(k: &ServiceKey) -> pb::ServiceKey {
    pb::ServiceKey {
        namespace: k.namespace.clone(),
        group: k.group.clone(),
        service: k.service.clone(),
    }
}

/// The service key a message names; empty namespace and group take their defaults (a missing
/// key is `&pb::ServiceKey::default()`: the caller validates the empty name).
pub fn service_from_pb(k: &pb::ServiceKey) -> ServiceKey {
    ServiceKey::new(&k.namespace, &k.group, &k.service)
}

/// An instance key as the protocol carries it.
pub fn instance_key_to_pb(k: &InstanceKey) -> pb::InstanceKey {
    pb::InstanceKey {
        ip: k.ip.clone(),
        port: u32::from(k.port),
        cluster: k.cluster.clone(),
    }
}

/// The instance key a message names; an empty cluster is the default one.
///
/// # Errors
/// A port outside 1-65535 (field `port`). The ip is not checked here.
pub fn instance_key_from_pb(k: &pb::InstanceKey) -> Result<InstanceKey, ValidationError> {
    let port = gangway_core::validate::port(k.port)?;
    Ok(InstanceKey::new(&k.ip, port, &k.cluster))
}

/// An instance as snapshots carry it.
pub fn instance_to_pb(i: &Instance) -> pb::Instance {
    pb::Instance {
        key: Some(instance_key_to_pb(&i.key)),
        weight: i.weight,
        enabled: i.enabled,
        healthy: i.healthy,
        ephemeral: i.ephemeral,
        metadata: metadata_to_pb(&i.metadata),
    }
}

/// The instance a snapshot carries; `None` when its key is missing or its port is no TCP port.
pub fn instance_from_pb(i: &pb::Instance) -> Option<Instance> {
    let key = instance_key_from_pb(i.key.as_ref()?).ok()?;
    Some(Instance {
        key,
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

/// A metadata map as the protocol carries it.
pub fn metadata_to_pb(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// A full snapshot of `service` at `view` (`request_id`: the `Pull` it answers, 0 for a push).
pub fn snapshot_to_pb(service: &ServiceKey, view: &View, request_id: u64) -> pb::Snapshot {
    pb::Snapshot {
        service: Some(service_to_pb(service)),
        revision: view.revision,
        instances: view.instances.iter().map(instance_to_pb).collect(),
        protection_triggered: view.protection_triggered,
        request_id,
        ..Default::default()
    }
}

/// The view a full snapshot carries, instances sorted by key; malformed instances are skipped
/// (and logged).
pub fn view_from_snapshot(s: &pb::Snapshot) -> View {
    View {
        revision: s.revision,
        instances: sorted(instances_from_pb(&s.instances)),
        protection_triggered: s.protection_triggered,
    }
}

/// `held` with the delta `delta` applied (see `Snapshot` in gangway.proto): the removed and
/// the upserted keys leave, the upserted instances come in as they are now. The caller checks
/// that the delta applies to the revision `held` is at.
pub fn apply_delta(held: &View, delta: &pb::Snapshot) -> View {
    let upserted = instances_from_pb(&delta.instances);
    let gone: BTreeSet<InstanceKey> = delta
        .removed
        .iter()
        .filter_map(|k| instance_key_from_pb(k).ok())
        .chain(upserted.iter().map(|i| i.key.clone()))
        .collect();
    let kept = held
        .instances
        .iter()
        .filter(|i| !gone.contains(&i.key))
        .cloned();
    View {
        revision: delta.revision,
        instances: sorted(kept.chain(upserted).collect()),
        protection_triggered: delta.protection_triggered,
    }
}

/// A subscriber's ack state as the protocol carries it.
pub fn ack_to_pb(a: &SubscriberAck) -> pb::SubscriberAck {
    pb::SubscriberAck {
        id: a.id.clone(),
        address: a.address.clone(),
        acked_revision: a.acked_revision,
        node: a.node.clone(),
    }
}

/// A subscriber's ack state from the protocol.
pub fn ack_from_pb(a: pb::SubscriberAck) -> SubscriberAck {
    SubscriberAck {
        id: a.id,
        address: a.address,
        acked_revision: a.acked_revision,
        node: a.node,
    }
}

/// A drain or readiness report as the protocol's `DrainResult`.
pub fn drain_to_pb(d: &DrainReport) -> pb::DrainResult {
    pb::DrainResult {
        revision: d.revision,
        waited_ms: d.waited_ms,
        complete: d.complete,
        acked: d.acked.iter().map(ack_to_pb).collect(),
        laggards: d.laggards.iter().map(ack_to_pb).collect(),
        notes: d.notes.clone(),
    }
}

/// The report a `DrainResult` carries.
pub fn drain_from_pb(d: pb::DrainResult) -> DrainReport {
    DrainReport {
        revision: d.revision,
        waited_ms: d.waited_ms,
        complete: d.complete,
        acked: d.acked.into_iter().map(ack_from_pb).collect(),
        laggards: d.laggards.into_iter().map(ack_from_pb).collect(),
        notes: d.notes,
    }
}

/// The `Reply` refusing request `request_id`: the refusal's code, message and field (empty
/// when none).
pub fn rejected_reply(request_id: u64, e: ErrorDetail) -> pb::Reply {
    pb::Reply {
        request_id,
        error_code: e.code.as_str().to_owned(),
        error_message: e.message,
        error_field: e.field.unwrap_or_default(),
        ..pb::Reply::default()
    }
}

/// The refusal a `Reply` carries, `None` when it is a success (empty `error_code`).
pub fn rejection(reply: &pb::Reply) -> Option<ErrorDetail> {
    (!reply.error_code.is_empty()).then(|| ErrorDetail {
        code: ErrorCode::parse(&reply.error_code),
        message: reply.error_message.clone(),
        field: (!reply.error_field.is_empty()).then(|| reply.error_field.clone()),
        rule: None,
    })
}

fn instances_from_pb(instances: &[pb::Instance]) -> Vec<Instance> {
    instances
        .iter()
        .filter_map(|i| {
            let converted = instance_from_pb(i);
            if converted.is_none() {
                tracing::warn!(instance = ?i.key, "skipping malformed instance in snapshot");
            }
            converted
        })
        .collect()
}

fn sorted(mut instances: Vec<Instance>) -> Vec<Instance> {
    instances.sort_by(|a, b| a.key.cmp(&b.key));
    instances
}

#[cfg(test)]
mod tests;
