//! Property tests: the ejection limits hold for any sequence of outcomes, checks and time.

use std::time::Duration;

use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use proptest::prelude::*;

use super::*;

#[derive(Debug, Clone)]
enum Op {
    Record(usize, Outcome),
    Advance(Duration),
    /// Admit the candidates selected by the bit mask.
    Admit(u32),
    TcpChecks(bool),
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        Just(Outcome::Success),
        Just(Outcome::ConnectFailure),
        Just(Outcome::NetworkError),
        Just(Outcome::ServerError),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..16usize, outcome()).prop_map(|(i, o)| Op::Record(i, o)),
        1 => (0..40_000u64).prop_map(|ms| Op::Advance(Duration::from_millis(ms))),
        2 => any::<u32>().prop_map(Op::Admit),
        1 => any::<bool>().prop_map(Op::TcpChecks),
    ]
}

fn config() -> impl Strategy<Value = (OutlierConfig, u32)> {
    (
        0..=100u32,
        0..4u32,
        0.0..1.0f64,
        any::<bool>(),
        any::<bool>(),
        1..4u32,
    )
        .prop_map(|(percent, streak, threshold, tcp, server, max_checks)| {
            let config = OutlierConfig {
                min_request_rate: 0.3,
                error_rate_threshold: threshold,
                errors: if server {
                    ErrorKinds::NetworkAndServerErrors
                } else {
                    ErrorKinds::NetworkOnly
                },
                consecutive_failures: streak,
                max_ejection_ratio: f64::from(percent) / 100.0,
                recovery_unit: Duration::from_secs(5),
                max_checks,
                check: if tcp {
                    RecoveryCheck::TcpConnect
                } else {
                    RecoveryCheck::Request
                },
                ..OutlierConfig::default()
            };
            (config, percent)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn limits_hold_for_any_sequence(
        n in 1..=16usize,
        (config, percent) in config(),
        ops in proptest::collection::vec(op(), 0..300),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let view: Vec<Instance> = (0..n)
                .map(|i| Instance::new(InstanceKey::new(&format!("10.0.0.{i}"), 80, "")))
                .collect();
            // Integer arithmetic, independent of the detector's float rounding.
            let floor = n * percent as usize / 100;
            let limit = if percent > 0 { floor.max(1) } else { 0 }.min(n - 1);
            let d = OutlierDetector::new(ServiceKey::named("svc"), config).expect("valid");
            for op in ops {
                match op {
                    Op::Record(i, outcome) => d.record(&view[i % n].key, outcome, n),
                    Op::Advance(by) => tokio::time::advance(by).await,
                    Op::Admit(mask) => {
                        let candidates: Vec<&Instance> = view
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| mask & (1 << i) != 0)
                            .map(|(_, instance)| instance)
                            .collect();
                        let admitted = d.admit(candidates.clone());
                        prop_assert!(admitted
                            .iter()
                            .all(|a| candidates.iter().any(|c| std::ptr::eq(*a, *c))));
                        prop_assert_eq!(admitted.is_empty(), candidates.is_empty());
                    }
                    Op::TcpChecks(ok) => {
                        for key in d.due_tcp_checks() {
                            d.check_result(&key, ok);
                        }
                    }
                }
                let ejected = d.ejected().len();
                prop_assert!(ejected <= limit, "{} ejected of {} (limit {})", ejected, n, limit);
                prop_assert!(ejected < n, "all {} ejected", n);
            }
            Ok(())
        })?;
    }
}
