use std::time::Duration;

use super::*;
use gangway_wire::rest::{Service, Subscriber, SubscriberAck};

fn inst(ip: &str, port: u16, healthy: bool) -> Instance {
    Instance {
        ip: ip.into(),
        port,
        cluster: "DEFAULT".into(),
        weight: 1.0,
        enabled: true,
        healthy,
        ephemeral: true,
        metadata: BTreeMap::new(),
        liveness: Some("session".into()),
    }
}

fn sample_view() -> View {
    let mut a = inst("10.0.0.5", 8080, true);
    a.metadata.insert("zone".into(), "a".into());
    a.metadata.insert("v".into(), "1.4".into());
    let mut b = inst("fd00::7", 80, false);
    b.weight = 0.5;
    b.liveness = Some("lease".into());
    View {
        namespace: "public".into(),
        group: "DEFAULT_GROUP".into(),
        service: "orders".into(),
        revision: 42,
        protection_triggered: true,
        warming_up: false,
        instances: vec![a, b],
    }
}

#[test]
fn view_has_a_header_line_and_one_row_per_instance() {
    let expected = "\
public/DEFAULT_GROUP/orders  revision 42  2 instances (serving view)  protection TRIGGERED
ADDRESS        CLUSTER  WEIGHT  HEALTHY  ENABLED  EPHEMERAL  LIVENESS  METADATA
10.0.0.5:8080  DEFAULT       1  yes      yes      yes        session   v=1.4,zone=a
[fd00::7]:80   DEFAULT     0.5  no       yes      yes        lease";
    assert_eq!(view(&sample_view(), false), expected);
}

#[test]
fn an_empty_view_says_so() {
    let mut v = sample_view();
    v.instances.clear();
    v.protection_triggered = false;
    v.warming_up = true;
    assert_eq!(
        view(&v, true),
        "public/DEFAULT_GROUP/orders  revision 42  0 instances (all)  protection not triggered  \
         (registry warming up)\nno instances"
    );
}

#[test]
fn an_instance_change_names_the_revision() {
    let c = InstanceChange {
        revision: 7,
        instance: inst("10.0.0.5", 80, true),
    };
    let text = instance_change("registered", "orders", &c);
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("registered 10.0.0.5:80 in orders (revision 7)")
    );
    assert!(lines.next().unwrap().starts_with("ADDRESS"));
    assert!(lines.next().unwrap().starts_with("10.0.0.5:80  DEFAULT"));
    assert_eq!(lines.next(), None);
}

#[test]
fn an_answer_without_liveness_has_no_liveness_column() {
    // The answers of register, offline and online do not say how the instance is kept alive.
    let mut i = inst("10.0.0.5", 80, true);
    i.liveness = None;
    i.metadata.insert("zone".into(), "a".into());
    let c = InstanceChange {
        revision: 7,
        instance: i,
    };
    let expected = "\
offline: 10.0.0.5:80 in orders (revision 7)
ADDRESS      CLUSTER  WEIGHT  HEALTHY  ENABLED  EPHEMERAL  METADATA
10.0.0.5:80  DEFAULT       1  yes      yes      yes        zone=a";
    assert_eq!(instance_change("offline:", "orders", &c), expected);
}

#[test]
fn services_table_shows_counts_and_a_dash_for_no_kind() {
    let list = ServiceList {
        services: vec![Service {
            namespace: "public".into(),
            group: "DEFAULT_GROUP".into(),
            service: "orders".into(),
            kind: None,
            revision: 3,
            instances: 2,
            serving: 1,
            subscribers: 4,
            states: Default::default(),
            protect_threshold: 0.5,
            metadata: BTreeMap::new(),
        }],
    };
    let expected = "\
NAMESPACE  GROUP          SERVICE  KIND  REVISION  INSTANCES  SERVING  SUBSCRIBERS  PROTECT
public     DEFAULT_GROUP  orders   -     3         2          1        4            0.5";
    assert_eq!(services(&list), expected);
    assert_eq!(services(&ServiceList { services: vec![] }), "no services");
}

#[test]
fn a_snapshot_is_one_line_with_time_revision_count_and_addresses() {
    let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
    assert_eq!(
        snapshot_line(at, &sample_view()),
        "2023-11-14T22:13:20.250Z  revision 42  2 instances  PROTECTION  10.0.0.5:8080 \
         [fd00::7]:80(unhealthy)"
    );
    let mut v = sample_view();
    v.instances.truncate(0);
    v.protection_triggered = false;
    assert_eq!(
        snapshot_line(at, &v),
        "2023-11-14T22:13:20.250Z  revision 42  0 instances"
    );
}

fn ack(id: &str, address: &str, rev: u64) -> SubscriberAck {
    SubscriberAck {
        id: id.into(),
        address: address.into(),
        acked_revision: rev,
        node: String::new(),
    }
}

#[test]
fn a_timed_out_drain_lists_laggards_first() {
    let r = DrainReport {
        revision: 12,
        waited_ms: 5003,
        complete: false,
        acked: vec![ack("s-1", "10.0.1.1:50000", 12)],
        laggards: vec![ack("s-2", "10.0.1.2:50000", 11)],
        notes: vec!["1 subscriber left during the drain".into()],
    };
    let expected = "\
drain of 10.0.0.5:80 in orders TIMED OUT: waited 5003 ms for revision 12; 1 acked, 1 lagging
SUBSCRIBER  ADDRESS         ACKED REVISION  STATUS
s-2         10.0.1.2:50000  11              LAGGING
s-1         10.0.1.1:50000  12              acked
note: 1 subscriber left during the drain";
    assert_eq!(drain("10.0.0.5:80", "orders", &r), expected);
}

#[test]
fn a_drain_without_subscribers_is_one_line() {
    let r = DrainReport {
        revision: 3,
        waited_ms: 0,
        complete: true,
        acked: vec![],
        laggards: vec![],
        notes: vec![],
    };
    assert_eq!(
        drain("[::1]:80", "orders", &r),
        "drain of [::1]:80 in orders complete: waited 0 ms for revision 3; 0 acked, 0 lagging"
    );
}

#[test]
fn subscribers_show_who_is_behind() {
    let s = Subscribers {
        revision: 9,
        subscribers: vec![
            Subscriber {
                id: "1".into(),
                address: "10.0.1.1:50000".into(),
                kind: "session".into(),
                client_name: Some("checkout".into()),
                acked_revision: 9,
                acked_at_ms: Some(0),
                pushed_revision: Some(9),
                behind: 0,
                lag_ms: None,
            },
            Subscriber {
                id: "2".into(),
                address: "10.0.1.2:41000".into(),
                kind: "poller".into(),
                client_name: None,
                acked_revision: 8,
                acked_at_ms: None,
                pushed_revision: None,
                behind: 1,
                lag_ms: Some(1_200),
            },
        ],
    };
    let expected = "\
orders  revision 9  2 subscribers
ID  ADDRESS         KIND     CLIENT    ACKED REVISION  ACKED AT                  PUSHED REVISION  STATUS
1   10.0.1.1:50000  session  checkout  9               1970-01-01T00:00:00.000Z  9                up to date
2   10.0.1.2:41000  poller   -         8               -                         -                behind";
    assert_eq!(subscribers("orders", &s), expected);
    let none = Subscribers {
        revision: 0,
        subscribers: vec![],
    };
    assert_eq!(
        subscribers("orders", &none),
        "orders  revision 0  0 subscribers\nno subscribers"
    );
}

#[test]
fn timestamps_are_utc_rfc3339_with_millis() {
    assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(rfc3339_ms(951_782_400_123), "2000-02-29T00:00:00.123Z");
    assert_eq!(rfc3339_ms(1_767_225_599_999), "2025-12-31T23:59:59.999Z");
}

#[test]
fn a_drain_across_nodes_names_the_node_of_each_subscriber() {
    let on = |mut a: SubscriberAck, node: &str| {
        a.node = node.into();
        a
    };
    let r = DrainReport {
        revision: 40,
        waited_ms: 3001,
        complete: false,
        acked: vec![on(ack("s1", "10.0.1.1:50000", 40), "n1")],
        laggards: vec![on(ack("s1", "10.0.1.2:50000", 38), "n2")],
        notes: vec![],
    };
    let expected = "\
drain of 10.0.0.5:80 in orders TIMED OUT: waited 3001 ms for revision 40; 1 acked, 1 lagging
SUBSCRIBER  NODE  ADDRESS         ACKED REVISION  STATUS
s1          n2    10.0.1.2:50000  38              LAGGING
s1          n1    10.0.1.1:50000  40              acked";
    assert_eq!(drain("10.0.0.5:80", "orders", &r), expected);
}

#[test]
fn the_nodes_table_marks_the_answering_node() {
    use gangway_wire::rest::{ClusterNode, ClusterView};
    let node = |name: &str, this: bool| ClusterNode {
        name: name.into(),
        http: format!("127.0.0.1:{}", if this { 8848 } else { 8849 }),
        grpc: format!("127.0.0.1:{}", if this { 9848 } else { 9849 }),
        lease: "694da2339105b309".into(),
        started_ms: 1,
        sessions: if this { 3 } else { 0 },
        subscribers: 2,
        this,
    };
    let view = ClusterView {
        mode: "cluster".into(),
        node: Some("n1".into()),
        revision: Some(26),
        nodes: vec![node("n1", true), node("n2", false)],
    };
    let expected = "\
NODE  HTTP            GRPC            LEASE             SESSIONS  SUBSCRIBERS
n1 *  127.0.0.1:8848  127.0.0.1:9848  694da2339105b309  3         2
n2    127.0.0.1:8849  127.0.0.1:9849  694da2339105b309  0         2";
    assert_eq!(nodes(&view), expected);
}
