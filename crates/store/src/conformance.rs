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
    large_batches_apply_whole_or_not_at_all(&new_store());
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

/// A batch as large as the store's [`Store::max_batch`] (200 writes without a bound) applies
/// whole; with a bound, one distinct key more is refused [`StoreError::TooLarge`] and changes
/// nothing, while repeated writes to one key count once.
///
/// [`StoreError::TooLarge`]: crate::StoreError::TooLarge
fn large_batches_apply_whole_or_not_at_all(store: &impl Store) {
    let svc = ServiceKey::named("large");
    let n = store.max_batch().unwrap_or(200);
    let puts = |range: std::ops::Range<usize>| -> Vec<Write> {
        range
            .map(|i| Write::PutInstance(svc.clone(), sample(1000 + i as u16)))
            .collect()
    };
    let mut batch = puts(0..n);
    // The same key again: still `n` distinct keys.
    batch.push(Write::DeleteInstance(
        svc.clone(),
        sample(1000).instance.key,
    ));
    store.apply(&batch).expect("a batch at the bound applies");
    let mut expected = Contents::default();
    expected.apply(&batch);
    assert_eq!(store.load().expect("load"), expected);
    assert_eq!(expected.instances[&svc].len(), n - 1);
    if store.max_batch().is_some() {
        let err = store
            .apply(&puts(n..2 * n + 1))
            .expect_err("one key over the bound");
        assert!(
            matches!(err, crate::StoreError::TooLarge { writes, max } if writes == n + 1 && max == n),
            "{err}"
        );
        assert_eq!(store.load().expect("load"), expected, "nothing applied");
    }
}
