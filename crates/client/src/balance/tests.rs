use std::sync::Arc;

use gangway_core::model::{Instance, InstanceKey};
use gangway_core::view::View;

use super::*;

fn inst(ip: &str, weight: f64) -> Instance {
    let mut i = Instance::new(InstanceKey::new(ip, 80, ""));
    i.weight = weight;
    i
}

fn view(instances: Vec<Instance>) -> View {
    View {
        revision: 1,
        instances,
        protection_triggered: false,
    }
}

fn picks(b: &dyn Balancer, v: &View, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| b.pick(v).map(|i| i.key.ip).unwrap_or_else(|| "-".into()))
        .collect()
}

#[test]
fn round_robin_cycles_in_view_order() {
    let v = view(vec![inst("a", 1.0), inst("b", 5.0), inst("c", 1.0)]);
    assert_eq!(
        picks(&RoundRobin::new(), &v, 7),
        ["a", "b", "c", "a", "b", "c", "a"]
    );
}

#[test]
fn smooth_weighted_5_1_1_interleaves() {
    let v = view(vec![inst("a", 5.0), inst("b", 1.0), inst("c", 1.0)]);
    let b = SmoothWeighted::new();
    assert_eq!(picks(&b, &v, 7), ["a", "a", "b", "a", "c", "a", "a"]);
    // The cycle repeats exactly: all current weights are back at 0.
    assert_eq!(picks(&b, &v, 7), ["a", "a", "b", "a", "c", "a", "a"]);
}

#[test]
fn smooth_weighted_equal_weights_is_round_robin() {
    let v = view(vec![inst("a", 2.0), inst("b", 2.0), inst("c", 2.0)]);
    assert_eq!(
        picks(&SmoothWeighted::new(), &v, 6),
        ["a", "b", "c", "a", "b", "c"]
    );
}

#[test]
fn smooth_weighted_shares_match_weights() {
    let v = view(vec![inst("a", 3.0), inst("b", 2.0), inst("c", 0.5)]);
    let got = picks(&SmoothWeighted::new(), &v, 11);
    let count = |ip: &str| got.iter().filter(|g| *g == ip).count();
    assert_eq!((count("a"), count("b"), count("c")), (6, 4, 1));
}

#[test]
fn smooth_weighted_keeps_state_across_view_changes() {
    let b = SmoothWeighted::new();
    let v1 = view(vec![inst("a", 5.0), inst("b", 1.0), inst("c", 1.0)]);
    assert_eq!(picks(&b, &v1, 2), ["a", "a"]);
    // c leaves: a (-4) and b (2) keep their current weights.
    let v2 = view(vec![inst("a", 5.0), inst("b", 1.0)]);
    assert_eq!(picks(&b, &v2, 3), ["b", "a", "a"]);
}

#[test]
fn weight_zero_is_never_picked() {
    let v = view(vec![inst("a", 0.0), inst("b", 1.0), inst("c", 0.0)]);
    assert_eq!(picks(&RoundRobin::new(), &v, 4), ["b"; 4]);
    assert_eq!(picks(&SmoothWeighted::new(), &v, 4), ["b"; 4]);
    let all_zero = view(vec![inst("a", 0.0), inst("b", 0.0)]);
    assert_eq!(RoundRobin::new().pick(&all_zero), None);
    assert_eq!(SmoothWeighted::new().pick(&all_zero), None);
}

#[test]
fn empty_view_picks_nothing() {
    assert_eq!(RoundRobin::new().pick(&view(vec![])), None);
    assert_eq!(SmoothWeighted::new().pick(&view(vec![])), None);
}

#[test]
fn disabled_and_non_finite_weights_are_skipped() {
    let mut off = inst("a", 1.0);
    off.enabled = false;
    let v = view(vec![
        off,
        inst("b", f64::NAN),
        inst("c", f64::INFINITY),
        inst("d", 1.0),
    ]);
    assert_eq!(picks(&RoundRobin::new(), &v, 2), ["d", "d"]);
    assert_eq!(picks(&SmoothWeighted::new(), &v, 2), ["d", "d"]);
}

#[test]
fn protection_prefers_healthy_then_falls_back_to_any() {
    let mut sick_a = inst("a", 1.0);
    sick_a.healthy = false;
    let mut sick_c = inst("c", 5.0);
    sick_c.healthy = false;
    let mut v = view(vec![sick_a.clone(), inst("b", 1.0), sick_c.clone()]);
    v.protection_triggered = true;
    assert_eq!(picks(&RoundRobin::new(), &v, 3), ["b", "b", "b"]);
    assert_eq!(picks(&SmoothWeighted::new(), &v, 3), ["b", "b", "b"]);

    let mut none_healthy = view(vec![sick_a, sick_c]);
    none_healthy.protection_triggered = true;
    assert_eq!(picks(&RoundRobin::new(), &none_healthy, 3), ["a", "c", "a"]);
    assert_eq!(
        picks(&SmoothWeighted::new(), &none_healthy, 6),
        ["c", "c", "a", "c", "c", "c"]
    );
}

#[test]
fn balancers_are_shareable_across_threads() {
    let v = Arc::new(view(vec![inst("a", 1.0), inst("b", 1.0)]));
    let b: Arc<dyn Balancer> = Arc::new(SmoothWeighted::new());
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (b, v) = (b.clone(), v.clone());
            std::thread::spawn(move || (0..100).filter(|_| b.pick(&v).is_some()).count())
        })
        .collect();
    let total: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(total, 400);
    // 400 picks of two equal weights: back to the start, a is next.
    assert_eq!(b.pick(&v).unwrap().key.ip, "a");
}

#[test]
fn random_picks_only_pickable_instances_and_covers_them() {
    let v = view(vec![inst("a", 1.0), inst("b", 0.0), inst("c", 3.0)]);
    let got = picks(&Random::new(), &v, 300);
    assert!(got.iter().all(|ip| ip == "a" || ip == "c"), "{got:?}");
    assert!(got.iter().any(|ip| ip == "a") && got.iter().any(|ip| ip == "c"));
    assert_eq!(Random::new().pick(&view(vec![])), None);
}

#[test]
fn p2c_prefers_the_less_loaded_of_two() {
    let v = view(vec![inst("a", 1.0), inst("b", 1.0)]);
    let b = PowerOfTwoChoices::new();
    let a_key = v.instances[0].key.clone();
    for _ in 0..3 {
        b.started(&a_key);
    }
    // With two candidates both are always drawn: the idle one wins every time.
    assert_eq!(picks(&b, &v, 20), vec!["b"; 20]);
    for _ in 0..3 {
        b.finished(&a_key);
    }
    assert_eq!(b.in_flight(&a_key), 0);
    b.finished(&a_key);
    assert_eq!(b.in_flight(&a_key), 0, "never below zero");
}

#[test]
fn p2c_with_one_candidate_takes_it_and_with_none_gives_none() {
    let b = PowerOfTwoChoices::new();
    assert_eq!(picks(&b, &view(vec![inst("a", 1.0)]), 3), ["a", "a", "a"]);
    assert_eq!(b.pick(&view(vec![inst("z", 0.0)])), None);
}

#[test]
fn pick_from_respects_an_already_filtered_candidate_list() {
    let v = view(vec![inst("a", 1.0), inst("b", 1.0), inst("c", 1.0)]);
    let tried = &v.instances[0].key;
    let candidates: Vec<&Instance> = pickable(&v)
        .into_iter()
        .filter(|i| &i.key != tried)
        .collect();
    for b in [
        &RoundRobin::new() as &dyn Balancer,
        &SmoothWeighted::new(),
        &Random::new(),
        &PowerOfTwoChoices::new(),
    ] {
        for _ in 0..10 {
            assert_ne!(
                b.pick_from(&candidates).map(|i| i.key.ip),
                Some("a".to_string())
            );
        }
    }
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    fn arb_view() -> impl Strategy<Value = View> {
        proptest::collection::vec((0u8..4, any::<bool>(), any::<bool>()), 0..8).prop_map(|specs| {
            let instances = specs
                .into_iter()
                .enumerate()
                .map(|(n, (w, enabled, healthy))| {
                    let mut i = inst(&format!("10.0.0.{n}"), f64::from(w));
                    i.enabled = enabled;
                    i.healthy = healthy;
                    i
                })
                .collect();
            view(instances)
        })
    }

    proptest! {
        #[test]
        fn picks_are_always_pickable_instances_of_the_current_view(
            views in proptest::collection::vec(arb_view(), 1..6),
            picks_per_view in 1usize..20,
        ) {
            let balancers: [Box<dyn Balancer>; 4] = [
                Box::new(RoundRobin::new()),
                Box::new(SmoothWeighted::new()),
                Box::new(Random::new()),
                Box::new(PowerOfTwoChoices::new()),
            ];
            for b in &balancers {
                for v in &views {
                    let allowed: Vec<&Instance> = pickable(v);
                    for _ in 0..picks_per_view {
                        match b.pick(v) {
                            Some(i) => prop_assert!(allowed.iter().any(|a| a.key == i.key), "{:?} not pickable", i.key),
                            None => prop_assert!(allowed.is_empty()),
                        }
                    }
                }
            }
        }
    }
}
