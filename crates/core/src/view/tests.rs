use proptest::prelude::*;

use super::*;
use crate::model::{Instance, InstanceKey};

fn five_with_four_down() -> Vec<Instance> {
    (1..=5)
        .map(|n| {
            let mut i = Instance::new(InstanceKey::new(&format!("10.0.0.{n}"), 80, ""));
            i.healthy = n == 1;
            i
        })
        .collect()
}

#[test]
fn protect_threshold_table_of_design_section_2() {
    let all = five_with_four_down();
    // (threshold, view size, triggered): healthy/total = 1/5 = 0.2.
    for (threshold, size, triggered) in [
        (0.0, 1, false),
        (0.1, 1, false),
        (0.2, 5, true),
        (0.5, 5, true),
    ] {
        let view = View::build(3, &all, threshold);
        assert_eq!(view.instances.len(), size, "threshold {threshold}");
        assert_eq!(
            view.protection_triggered, triggered,
            "threshold {threshold}"
        );
        assert_eq!(view.revision, 3);
        // Real health flags are kept, never rewritten to healthy.
        assert_eq!(view.instances.iter().filter(|i| i.healthy).count(), 1);
    }
}

#[test]
fn offline_and_zero_weight_are_left_out() {
    let mut all = five_with_four_down();
    for i in &mut all {
        i.healthy = true;
    }
    all[0].enabled = false;
    all[1].weight = 0.0;
    let view = View::build(1, &all, 0.0);
    let ips: Vec<&str> = view.instances.iter().map(|i| i.key.ip.as_str()).collect();
    assert_eq!(ips, ["10.0.0.3", "10.0.0.4", "10.0.0.5"]);
    assert!(!view.contains(&all[0].key));
}

#[test]
fn threshold_zero_fires_only_when_none_is_healthy() {
    let mut all = five_with_four_down();
    all[0].healthy = false;
    let view = View::build(1, &all, 0.0);
    assert!(view.protection_triggered);
    assert_eq!(view.instances.len(), 5);
    assert!(!View::build(1, &[], 0.0).protection_triggered);
}

#[test]
fn offline_instances_stay_out_even_under_protection() {
    let mut all = five_with_four_down();
    all[4].enabled = false;
    let view = View::build(1, &all, 1.0);
    assert!(view.protection_triggered);
    assert_eq!(view.instances.len(), 4);
}

proptest! {
    #[test]
    fn view_is_a_subset_of_enabled(
        flags in proptest::collection::vec((any::<bool>(), any::<bool>(), 0u8..3), 0..12),
        threshold in 0.0f64..=1.0,
    ) {
        let all: Vec<Instance> = flags.iter().enumerate().map(|(n, (enabled, healthy, w))| {
            let mut i = Instance::new(InstanceKey::new("10.0.0.1", n as u16 + 1, ""));
            i.enabled = *enabled;
            i.healthy = *healthy;
            i.weight = f64::from(*w);
            i
        }).collect();
        let view = View::build(9, &all, threshold);
        for i in &view.instances {
            prop_assert!(i.enabled);
            prop_assert!(view.protection_triggered || (i.healthy && i.weight > 0.0));
        }
        if !view.protection_triggered {
            prop_assert_eq!(view.instances.len(), all.iter().filter(|i| i.is_serving()).count());
        }
    }
}

fn arb_instance() -> impl Strategy<Value = Instance> {
    (
        0u8..20,
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(0.0), Just(1.0), Just(2.5)],
    )
        .prop_map(|(n, enabled, healthy, weight)| {
            let mut i = Instance::new(InstanceKey::new(&format!("10.0.0.{n}"), 80, ""));
            i.enabled = enabled;
            i.healthy = healthy;
            i.weight = weight;
            i
        })
}

proptest! {
    /// The tally's verdicts are the view's, for any instances and threshold.
    #[test]
    fn tally_agrees_with_the_built_view(
        instances in proptest::collection::vec(arb_instance(), 0..12),
        threshold in prop_oneof![Just(0.0), Just(0.3), Just(0.5), Just(1.0)],
    ) {
        // Keys unique, as in a service.
        let mut seen = std::collections::BTreeMap::new();
        for i in instances {
            seen.insert(i.key.clone(), i);
        }
        let all: Vec<Instance> = seen.into_values().collect();
        let mut tally = Tally::default();
        for i in &all {
            tally.add(i);
        }
        let view = View::build(1, &all, threshold);
        prop_assert_eq!(tally.protection_triggered(threshold), view.protection_triggered);
        prop_assert_eq!(tally.view_len(threshold), view.instances.len());
        for i in &all {
            prop_assert_eq!(tally.in_view(i, threshold), view.contains(&i.key));
        }
        // Removing counts back out to nothing.
        for i in &all {
            tally.remove(i);
        }
        prop_assert_eq!(tally, Tally::default());
    }
}
