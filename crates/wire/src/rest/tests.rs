use serde_json::json;

use super::*;

fn instance(liveness: Option<&str>) -> Instance {
    let mut i = DomainInstance::new(InstanceKey::new("fd00::7", 80, ""));
    i.metadata.insert("zone".into(), "a".into());
    Instance::from_domain(i, liveness)
}

#[test]
fn an_instance_says_who_keeps_it_alive_only_when_told() {
    assert_eq!(
        serde_json::to_value(instance(Some("lease"))).unwrap(),
        json!({"ip": "fd00::7", "port": 80, "cluster": "DEFAULT", "weight": 1.0,
               "enabled": true, "healthy": true, "ephemeral": true,
               "metadata": {"zone": "a"}, "liveness": "lease"})
    );
    let change = serde_json::to_value(instance(None)).unwrap();
    assert!(change.get("liveness").is_none(), "{change}");
    assert_eq!(instance(None).addr(), "[fd00::7]:80");
}

#[test]
fn an_instance_reads_back_into_the_domain_with_the_default_cluster() {
    let sent: Instance = serde_json::from_value(json!({"ip": "10.0.0.1", "port": 8080,
        "weight": 2.0, "enabled": true, "healthy": false, "ephemeral": false}))
    .unwrap();
    let domain = DomainInstance::from(sent);
    assert_eq!(domain.key, InstanceKey::new("10.0.0.1", 8080, "DEFAULT"));
    assert!(!domain.healthy && !domain.ephemeral);
    assert!(
        serde_json::from_value::<Instance>(json!({"ip": "10.0.0.1", "port": 70000,
        "weight": 1.0, "enabled": true, "healthy": true, "ephemeral": true}))
        .is_err()
    );
}

#[test]
fn a_view_becomes_the_domain_view() {
    let view = View {
        namespace: "public".into(),
        group: "DEFAULT_GROUP".into(),
        service: "orders".into(),
        revision: 9,
        protection_triggered: true,
        warming_up: false,
        instances: vec![instance(Some("session"))],
    };
    let domain = DomainView::from(view);
    assert_eq!(domain.revision, 9);
    assert!(domain.protection_triggered);
    assert_eq!(domain.instances[0].key.addr(), "[fd00::7]:80");
    // A registry may leave out what it does not know yet.
    let bare: View = serde_json::from_value(json!({"revision": 0})).unwrap();
    assert!(bare.instances.is_empty() && bare.service.is_empty());
}

#[test]
fn register_body_leaves_unset_fields_to_the_server() {
    let body = RegisterRequest {
        ip: "10.0.0.5".into(),
        port: 80,
        ephemeral: Some(true),
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_value(&body).unwrap(),
        json!({"ip": "10.0.0.5", "port": 80, "ephemeral": true})
    );
    let probed = RegisterRequest {
        probe: Some(ProbeRequest {
            kind: Some(ProbeKind::Http),
            path: Some("/ready".into()),
            ..Default::default()
        }),
        ..body
    };
    assert_eq!(
        serde_json::to_value(&probed).unwrap()["probe"],
        json!({"kind": "http", "path": "/ready"})
    );
}

#[test]
fn request_bodies_refuse_unknown_fields() {
    let err = serde_json::from_value::<RegisterRequest>(json!({"ip": "a", "port": 1, "tll_ms": 5}))
        .unwrap_err();
    assert!(err.to_string().contains("unknown field `tll_ms`"), "{err}");
    assert!(serde_json::from_value::<DrainRequest>(json!({"timeout": 5})).is_err());
    assert!(serde_json::from_value::<OnlineRequest>(json!({"wait": true, "x": 1})).is_err());
    assert!(serde_json::from_value::<OfflineRequest>(json!({"forse": true})).is_err());
    assert!(serde_json::from_value::<PatchRequest>(json!({"weigth": 1})).is_err());
    assert!(serde_json::from_value::<SettingsRequest>(json!({"protect": 0.5})).is_err());
    assert!(serde_json::from_value::<ProbeRequest>(json!({"kind": "udp"})).is_err());
}

#[test]
fn optional_bodies_send_only_what_is_set() {
    let drain = DrainRequest {
        timeout_ms: Some(5000),
        force: true,
    };
    assert_eq!(
        serde_json::to_value(drain).unwrap(),
        json!({"timeout_ms": 5000, "force": true})
    );
    let online = OnlineRequest {
        wait: true,
        timeout_ms: Some(5000),
    };
    assert_eq!(
        serde_json::to_value(online).unwrap(),
        json!({"wait": true, "timeout_ms": 5000})
    );
    assert_eq!(
        serde_json::to_value(SettingsRequest::default()).unwrap(),
        json!({})
    );
    assert_eq!(
        serde_json::to_value(PatchRequest::default()).unwrap(),
        json!({"force": false})
    );
}

#[test]
fn a_probe_takes_the_defaults_it_leaves_out() {
    let spec = ProbeRequest {
        interval_ms: Some(500),
        ..Default::default()
    }
    .spec();
    assert_eq!(
        spec,
        ProbeSpec {
            interval_ms: 500,
            ..ProbeSpec::default()
        }
    );
}

#[test]
fn subscriber_ids_may_be_numbers_or_strings() {
    let s: Subscriber =
        serde_json::from_str(r#"{"id":7,"address":"a","acked_revision":3}"#).unwrap();
    assert_eq!(s.id, "7");
    let s: Subscriber =
        serde_json::from_str(r#"{"id":"s-7","address":"a","acked_revision":3}"#).unwrap();
    assert_eq!(s.id, "s-7");
    assert_eq!(s.pushed_revision, None);
    assert!(serde_json::from_str::<Subscriber>(r#"{"id":true}"#).is_err());
}

#[test]
fn a_service_without_instances_has_no_kind() {
    let s: Service = serde_json::from_value(json!({"namespace": "public",
        "group": "DEFAULT_GROUP", "service": "orders", "kind": null}))
    .unwrap();
    assert_eq!(s.kind, None);
    assert_eq!((s.instances, s.revision), (0, 0));
    let s: Service = serde_json::from_value(json!({"namespace": "public",
        "group": "DEFAULT_GROUP", "service": "orders", "kind": "persistent"}))
    .unwrap();
    assert_eq!(s.kind, Some(Kind::Persistent));
}
