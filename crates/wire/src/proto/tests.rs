use super::*;

fn pb_instance(ip: &str, port: u32, weight: f64) -> pb::Instance {
    pb::Instance {
        key: Some(pb::InstanceKey {
            ip: ip.into(),
            port,
            cluster: String::new(),
        }),
        weight,
        enabled: true,
        healthy: true,
        ephemeral: true,
        metadata: HashMap::new(),
    }
}

#[test]
fn malformed_instances_are_skipped_and_the_rest_sorted() {
    let snap = pb::Snapshot {
        service: None,
        revision: 4,
        instances: vec![
            pb_instance("10.0.0.2", 80, 1.0),
            pb_instance("10.0.0.1", 70_000, 1.0),
            pb_instance("10.0.0.1", 80, 1.0),
            pb::Instance::default(),
        ],
        protection_triggered: true,
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
fn a_snapshot_round_trips_a_view() {
    let mut a = Instance::new(InstanceKey::new("10.0.0.1", 80, ""));
    a.metadata.insert("zone".into(), "a".into());
    a.weight = 2.5;
    let b = Instance::new(InstanceKey::new("10.0.0.2", 80, "blue"));
    let view = View {
        revision: 12,
        instances: vec![a, b],
        protection_triggered: false,
    };
    let service = ServiceKey::named("orders");
    let snap = snapshot_to_pb(&service, &view, 7);
    assert_eq!(snap.request_id, 7);
    assert!(!snap.delta);
    assert_eq!(service_from_pb(snap.service.as_ref().unwrap()), service);
    assert_eq!(view_from_snapshot(&snap), view);
}

#[test]
fn keys_take_their_defaults_and_refuse_a_bad_port() {
    let k = service_from_pb(&pb::ServiceKey {
        service: "orders".into(),
        ..Default::default()
    });
    assert_eq!(k, ServiceKey::named("orders"));
    let key = InstanceKey::new("10.0.0.1", 80, "");
    assert_eq!(instance_key_from_pb(&instance_key_to_pb(&key)), Ok(key));
    let err = instance_key_from_pb(&pb::InstanceKey {
        ip: "10.0.0.1".into(),
        port: 0,
        cluster: String::new(),
    })
    .unwrap_err();
    assert_eq!(err.field, "port");
}

#[test]
fn a_delta_replaces_what_changed_and_drops_what_left() {
    let held = view_from_snapshot(&pb::Snapshot {
        revision: 5,
        instances: vec![
            pb_instance("10.0.0.1", 80, 1.0),
            pb_instance("10.0.0.2", 80, 1.0),
            pb_instance("10.0.0.3", 80, 1.0),
        ],
        ..Default::default()
    });
    let delta = pb::Snapshot {
        revision: 7,
        base_revision: 4,
        delta: true,
        instances: vec![
            pb_instance("10.0.0.2", 80, 5.0),
            pb_instance("10.0.0.4", 80, 1.0),
        ],
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
fn a_drain_report_round_trips() {
    let ack = |id: &str, rev| SubscriberAck {
        id: id.into(),
        address: "127.0.0.1:1".into(),
        acked_revision: rev,
        node: String::new(),
    };
    let report = DrainReport {
        revision: 9,
        waited_ms: 310,
        complete: false,
        acked: vec![ack("sub1", 9)],
        laggards: vec![ack("p-web", 8)],
        notes: vec!["timed out".into()],
    };
    assert_eq!(drain_from_pb(drain_to_pb(&report)), report);
    assert_eq!(
        drain_from_pb(pb::DrainResult::default()),
        DrainReport::default()
    );
}

#[test]
fn a_reply_carries_a_refusal_or_none() {
    let ok = pb::Reply {
        request_id: 1,
        revision: 9,
        ..Default::default()
    };
    assert_eq!(rejection(&ok), None);
    let refusal = ErrorDetail::new(ErrorCode::InvalidArgument, "bad port", Some("port"));
    let reply = rejected_reply(3, refusal.clone());
    assert_eq!(
        (reply.request_id, reply.error_code.as_str()),
        (3, "invalid_argument")
    );
    assert_eq!(rejection(&reply), Some(refusal));
    let unnamed = rejected_reply(4, ErrorDetail::new(ErrorCode::Conflict, "kind", None));
    assert_eq!(unnamed.error_field, "");
    assert_eq!(rejection(&unnamed).unwrap().field, None);
}
