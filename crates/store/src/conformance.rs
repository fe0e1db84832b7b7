//! The conformance suite: every [`Store`](crate::Store) backend calls [`run`] from its tests.

use gangway_core::model::{
    Instance, InstanceKey, OfflineMark, ProbeSpec, ServiceKey, ServiceSettings, StoredInstance,
};

use crate::{Contents, Store, Write};

/// Runs every check against fresh stores made by `new_store`. Panics on the first mismatch.
pub fn run<S: Store>(new_store: impl Fn() -> S) {
    empty_store_loads_empty(&new_store());
    writes_round_trip(&new_store());
    deletes_remove_and_tolerate_absence(&new_store());
    batch_applies_in_order(&new_store());
    owners_round_trip(&new_store());
}

/// A sample persistent instance `10.0.0.<n>:8080` with metadata and a non-default probe,
/// unowned ([`StoredInstance::owner`] `None`).
pub fn sample(n: u16) -> StoredInstance {
    let mut instance = Instance::new(InstanceKey::new(
        &format!("10.0.{}.{}", n / 256, n % 256),
        8080,
        "",
    ));
    instance.ephemeral = false;
    instance.weight = 2.5;
    instance.metadata.insert("zone".into(), format!("z{n}"));
    StoredInstance {
        instance,
        probe: ProbeSpec {
            interval_ms: 500,
            ..ProbeSpec::default()
        },
        owner: None,
    }
}

fn empty_store_loads_empty(store: &impl Store) {
    assert_eq!(store.load().expect("load"), Contents::default());
}

fn writes_round_trip(store: &impl Store) {
    let svc = ServiceKey::named("orders");
    let settings = ServiceSettings {
        protect_threshold: 0.3,
        metadata: [("team".into(), "a".into())].into(),
    };
    let mark = OfflineMark {
        since_ms: 1_700_000_000_000,
    };
    let batch = vec![
        Write::PutInstance(svc.clone(), sample(1)),
        Write::PutInstance(svc.clone(), sample(2)),
        Write::PutService(svc.clone(), settings),
        Write::PutOfflineMark(svc.clone(), sample(1).instance.key, mark),
    ];
    store.apply(&batch).expect("apply");
    let mut expected = Contents::default();
    expected.apply(&batch);
    assert_eq!(store.load().expect("load"), expected);
    assert_eq!(expected.instances[&svc].len(), 2);
}

fn deletes_remove_and_tolerate_absence(store: &impl Store) {
    let svc = ServiceKey::new("dev", "g", "cart");
    store
        .apply(&[Write::PutInstance(svc.clone(), sample(7))])
        .expect("put");
    let key = sample(7).instance.key;
    let batch = [
        Write::DeleteInstance(svc.clone(), key.clone()),
        Write::DeleteInstance(svc.clone(), key.clone()),
        Write::DeleteService(svc.clone()),
        Write::DeleteOfflineMark(svc, key),
    ];
    store.apply(&batch).expect("delete");
    assert_eq!(store.load().expect("load"), Contents::default());
}

fn batch_applies_in_order(store: &impl Store) {
    let svc = ServiceKey::named("pay");
    let mut changed = sample(3);
    changed.instance.weight = 9.0;
    let batch = [
        Write::PutInstance(svc.clone(), sample(3)),
        Write::PutInstance(svc.clone(), changed.clone()),
    ];
    store.apply(&batch).expect("apply");
    let loaded = store.load().expect("load");
    assert_eq!(loaded.instances[&svc][&changed.instance.key], changed);
}

/// The owner of a persistent instance is stored with it (docs/security.md): a put with an
/// owner loads with that owner, a later put by another owner replaces it, an unowned one
/// loads unowned.
fn owners_round_trip(store: &impl Store) {
    let svc = ServiceKey::named("owned");
    let mut alice = sample(11);
    alice.owner = Some("alice".into());
    let mut taken = sample(12);
    taken.owner = Some("alice".into());
    let mut by_admin = taken.clone();
    by_admin.owner = Some("token:admin".into());
    store
        .apply(&[
            Write::PutInstance(svc.clone(), alice.clone()),
            Write::PutInstance(svc.clone(), taken),
            Write::PutInstance(svc.clone(), sample(13)),
        ])
        .expect("put");
    store
        .apply(&[Write::PutInstance(svc.clone(), by_admin.clone())])
        .expect("takeover");
    let loaded = store.load().expect("load");
    let owners: Vec<Option<&str>> = loaded.instances[&svc]
        .values()
        .map(|i| i.owner.as_deref())
        .collect();
    assert_eq!(owners, [Some("alice"), Some("token:admin"), None]);
    assert_eq!(loaded.instances[&svc][&alice.instance.key], alice);
    assert_eq!(loaded.instances[&svc][&by_admin.instance.key], by_admin);
}
