use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gangway_core::model::{Instance, InstanceKey};

use super::*;
use crate::balance::{PowerOfTwoChoices, Random, RoundRobin, SmoothWeighted, pickable};
use gangway_core::view::View;

/// The registration time of the warming instances in these tests.
fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn at(secs: f64) -> SystemTime {
    t0() + Duration::from_secs_f64(secs)
}

fn inst(ip: &str, weight: f64) -> Instance {
    let mut i = Instance::new(InstanceKey::new(ip, 80, ""));
    i.weight = weight;
    i
}

fn warming(ip: &str, window: Duration) -> Instance {
    let mut i = inst(ip, 1.0);
    i.metadata.extend(warm_up_metadata(window, t0()));
    i
}

fn view(instances: Vec<Instance>) -> View {
    View {
        revision: 1,
        instances,
        protection_triggered: false,
    }
}

fn share_of(b: &dyn Fn(&[&Instance]) -> Option<Instance>, v: &View, ip: &str, n: usize) -> f64 {
    let candidates = pickable(v);
    let hits = (0..n)
        .filter(|_| b(&candidates).is_some_and(|i| i.key.ip == ip))
        .count();
    hits as f64 / n as f64
}

#[test]
fn the_curve_is_envoys_with_a_floor() {
    let window = Duration::from_secs(10);
    let new = warming("n", window);
    let linear = WarmUpConfig::default();
    assert_eq!(linear.factor(&new, at(0.0)), 0.1, "floor at the start");
    assert_eq!(
        linear.factor(&new, at(0.5)),
        0.1,
        "still the floor: 0.05 < 0.1"
    );
    assert!((linear.factor(&new, at(2.5)) - 0.25).abs() < 1e-9);
    assert!((linear.factor(&new, at(7.5)) - 0.75).abs() < 1e-9);
    assert_eq!(
        linear.factor(&new, at(10.0)),
        1.0,
        "full weight at the window's end"
    );
    assert_eq!(linear.factor(&new, at(100.0)), 1.0);
    let square = WarmUpConfig::default().with_curvature(2.0);
    assert!((square.factor(&new, at(5.0)) - 0.25).abs() < 1e-9);
    let root = WarmUpConfig::default().with_curvature(0.5);
    assert!((root.factor(&new, at(2.5)) - 0.5).abs() < 1e-9);
    // Stamped in the consumer's future (clock skew): the floor, not a panic.
    assert_eq!(linear.factor(&new, t0() - Duration::from_secs(3)), 0.1);
}

#[test]
fn instances_without_usable_metadata_are_not_warming() {
    let cfg = WarmUpConfig::default();
    assert_eq!(cfg.factor(&inst("a", 1.0), at(0.0)), 1.0);
    let mut only_time = inst("b", 1.0);
    only_time
        .metadata
        .insert(REGISTERED_AT_KEY.into(), "1700000000000".into());
    assert_eq!(cfg.factor(&only_time, at(0.0)), 1.0);
    let mut garbage = warming("c", Duration::from_secs(10));
    garbage
        .metadata
        .insert(WARM_UP_KEY.into(), "ten seconds".into());
    assert_eq!(cfg.factor(&garbage, at(1.0)), 1.0);
    let zero = warming("d", Duration::ZERO);
    assert_eq!(cfg.factor(&zero, at(0.0)), 1.0);
    assert_eq!(warm_up_of(&garbage), None);
    assert_eq!(
        warm_up_of(&warming("e", Duration::from_millis(1500))),
        Some((t0(), Duration::from_millis(1500)))
    );
}

#[test]
fn metadata_is_unix_milliseconds() {
    let m = warm_up_metadata(Duration::from_secs(30), t0() + Duration::from_millis(7));
    assert_eq!(m[REGISTERED_AT_KEY], "1700000000007");
    assert_eq!(m[WARM_UP_KEY], "30000");
}

#[test]
fn bad_configs_name_their_field() {
    let bad = WarmUpConfig::default()
        .with_curvature(0.0)
        .with_min_weight(1.5);
    let problems = bad.problems();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].starts_with("warm_up.curvature:"),
        "{problems:?}"
    );
    assert!(
        problems[1].starts_with("warm_up.min_weight:"),
        "{problems:?}"
    );
    assert!(WarmUp::new(RoundRobin::new(), bad).is_err());
    assert!(
        WarmUpConfig::default()
            .with_curvature(f64::NAN)
            .validate()
            .is_err()
    );
    assert!(
        WarmUpConfig::default()
            .with_min_weight(0.0)
            .validate()
            .is_err()
    );
    assert!(WarmUpConfig::default().validate().is_ok());
}

#[test]
fn round_robin_gives_a_warming_instance_its_scaled_share_exactly() {
    let window = Duration::from_secs(10);
    let v = view(vec![inst("a", 1.0), inst("b", 1.0), warming("n", window)]);
    let b = WarmUp::new(RoundRobin::new(), WarmUpConfig::default()).unwrap();
    // At 5 s the factor is 0.5: share 0.5 / (0.5 + 2) = 0.2.
    let share = share_of(&|c| b.pick_from_at(c, at(5.0)), &v, "n", 1000);
    assert!((share - 0.2).abs() < 0.002, "share {share}");
    // After the window: a third.
    let share = share_of(&|c| b.pick_from_at(c, at(10.0)), &v, "n", 999);
    assert!((share - 1.0 / 3.0).abs() < 0.002, "share {share}");
}

#[test]
fn smooth_weighted_scales_the_warming_weight() {
    let window = Duration::from_secs(10);
    let mut heavy = warming("n", window);
    heavy.weight = 4.0;
    let v = view(vec![inst("a", 2.0), inst("b", 2.0), heavy]);
    let b = WarmUp::new(SmoothWeighted::new(), WarmUpConfig::default()).unwrap();
    // factor 0.25 at 2.5 s: 4 x 0.25 / (1 + 4) = 0.2.
    let share = share_of(&|c| b.pick_from_at(c, at(2.5)), &v, "n", 2000);
    assert!((share - 0.2).abs() < 0.01, "share {share}");
}

#[test]
fn when_every_instance_is_warming_none_is_held_back() {
    let window = Duration::from_secs(10);
    let v = view(vec![warming("a", window), warming("b", window)]);
    let b = WarmUp::new(RoundRobin::new(), WarmUpConfig::default()).unwrap();
    let share = share_of(&|c| b.pick_from_at(c, at(0.0)), &v, "a", 100);
    assert_eq!(share, 0.5);
    // One candidate left (the others tried or ejected) that is warming: it is taken.
    let lone = warming("z", window);
    assert_eq!(
        b.pick_from_at(&[&lone], at(0.0)).map(|i| i.key.ip),
        Some("z".to_owned())
    );
    assert_eq!(b.pick_from_at(&[], at(0.0)), None);
}

#[test]
fn random_and_p2c_get_the_scaled_share_on_average() {
    let window = Duration::from_secs(10);
    let v = view(vec![inst("a", 1.0), inst("b", 1.0), warming("n", window)]);
    for (name, b) in [
        (
            "random",
            Box::new(WarmUp::new(Random::new(), WarmUpConfig::default()).unwrap())
                as Box<dyn Balancer>,
        ),
        (
            "p2c",
            Box::new(WarmUp::new(PowerOfTwoChoices::new(), WarmUpConfig::default()).unwrap()),
        ),
    ] {
        // Through the trait: the wall clock is far past t0, so first check nothing is held.
        let share = share_of(&|c| b.pick_from(c), &v, "n", 3000);
        assert!((share - 1.0 / 3.0).abs() < 0.05, "{name}: share {share}");
    }
    let random = WarmUp::new(Random::new(), WarmUpConfig::default()).unwrap();
    let share = share_of(&|c| random.pick_from_at(c, at(2.5)), &v, "n", 6000);
    // factor 0.25: 0.25 / 2.25 = 0.111.
    assert!(
        (share - 0.111).abs() < 0.03,
        "random at 2.5 s: share {share}"
    );
}

/// The test at the balancer: a 10 s window, 60 req/s, three instances of which one is
/// new. Its share in each second follows f / (f + 2) with f = max(0.1, t / 10), and is a third
/// after the window.
#[test]
fn with_a_10s_window_the_share_follows_the_curve_then_is_full() {
    let window = Duration::from_secs(10);
    let v = view(vec![inst("a", 1.0), inst("b", 1.0), warming("n", window)]);
    let candidates = pickable(&v);
    let b = WarmUp::new(RoundRobin::new(), WarmUpConfig::default()).unwrap();
    let rate = 60.0;
    let mut per_second = vec![(0usize, 0usize); 13];
    for i in 0..(13 * 60) {
        let t = i as f64 / rate;
        let pick = b.pick_from_at(&candidates, at(t)).unwrap();
        let bucket = &mut per_second[t as usize];
        bucket.1 += 1;
        if pick.key.ip == "n" {
            bucket.0 += 1;
        }
    }
    for (second, (hits, total)) in per_second.iter().enumerate() {
        let got = *hits as f64 / *total as f64;
        // The mean factor over the second [s, s+1).
        let expected = if second >= 10 {
            1.0 / 3.0
        } else {
            let f = ((second as f64 + 0.5) / 10.0).max(0.1);
            f / (f + 2.0)
        };
        assert!(
            (got - expected).abs() < 0.04,
            "second {second}: share {got:.3}, curve says {expected:.3}"
        );
    }
}
