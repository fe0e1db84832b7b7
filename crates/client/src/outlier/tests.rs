use std::time::Duration;

use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio::time::{Instant, advance};

use super::window::RequestWindow;
use super::*;
use crate::Error;

fn key(i: usize) -> InstanceKey {
    InstanceKey::new(&format!("10.0.0.{i}"), 80, "")
}

fn instances(n: usize) -> Vec<Instance> {
    (0..n).map(|i| Instance::new(key(i))).collect()
}

fn ips(admitted: &[&Instance]) -> Vec<String> {
    admitted.iter().map(|i| i.key.ip.clone()).collect()
}

fn detector(config: OutlierConfig) -> OutlierDetector {
    OutlierDetector::new(ServiceKey::named("svc"), config).expect("valid config")
}

/// Only the error-rate trigger (consecutive failures disabled).
fn rate_only() -> OutlierConfig {
    OutlierConfig {
        consecutive_failures: 0,
        max_ejection_ratio: 0.5,
        ..OutlierConfig::default()
    }
}

/// Only the consecutive trigger, ejecting up to half of the instances.
fn streak_only() -> OutlierConfig {
    OutlierConfig {
        error_rate_threshold: 1.0,
        max_ejection_ratio: 0.5,
        ..OutlierConfig::default()
    }
}

fn record_n(d: &OutlierDetector, k: &InstanceKey, outcome: Outcome, times: usize, n: usize) {
    for _ in 0..times {
        d.record(k, outcome, n);
    }
}

/// Ejects `k` with consecutive connect failures (default streak of 5).
fn eject(d: &OutlierDetector, k: &InstanceKey, n: usize) {
    record_n(d, k, Outcome::ConnectFailure, 5, n);
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

// ---- configuration ----

#[test]
fn defaults_match_the_issue() {
    let c = OutlierConfig::default();
    assert_eq!(c.window, Duration::from_secs(10));
    assert_eq!(c.min_request_rate, 1.0);
    assert_eq!(c.error_rate_threshold, 0.5);
    assert_eq!(c.errors, ErrorKinds::NetworkOnly);
    assert_eq!(c.consecutive_failures, 5);
    assert_eq!(c.max_ejection_ratio, 0.2);
    assert_eq!(c.recovery_unit, Duration::from_secs(30));
    assert_eq!(c.max_checks, 20);
    assert_eq!(c.check, RecoveryCheck::Request);
    assert_eq!(c.min_requests(), 10);
    assert!(c.validate().is_ok());
}

#[test]
fn every_config_problem_is_reported() {
    let c = OutlierConfig {
        window: Duration::ZERO,
        min_request_rate: f64::NAN,
        error_rate_threshold: 1.5,
        max_ejection_ratio: -0.1,
        recovery_unit: Duration::ZERO,
        max_checks: 0,
        check_timeout: Duration::ZERO,
        ..OutlierConfig::default()
    };
    let Err(Error::InvalidConfig { problems }) = c.validate() else {
        panic!("accepted")
    };
    assert_eq!(problems.len(), 7, "{problems:?}");
    assert!(problems.iter().all(|p| p.starts_with("outlier.")));
    let Err(Error::InvalidConfig { problems: again }) =
        OutlierDetector::new(ServiceKey::named("svc"), c)
    else {
        panic!("detector accepted an invalid config")
    };
    assert_eq!(again, problems);
}

#[test]
fn ratio_floor_examples() {
    let with = |ratio| OutlierConfig::default().with_max_ejection_ratio(ratio);
    assert_eq!(with(0.6).max_ejected(6), 3, "6 x 0.6 = 3.6 -> 3");
    assert_eq!(with(0.2).max_ejected(4), 1, "4 x 0.2 = 0.8 -> at least one");
    assert_eq!(
        with(0.2).max_ejected(3),
        1,
        "a crashed one of three is ejected"
    );
    assert_eq!(with(0.2).max_ejected(2), 1);
    assert_eq!(with(0.2).max_ejected(5), 1);
    assert_eq!(with(0.29).max_ejected(100), 29, "f64 gives 28.999...");
    assert_eq!(with(1.0).max_ejected(3), 2, "never the last one");
    assert_eq!(with(1.0).max_ejected(1), 0);
    assert_eq!(with(1.0).max_ejected(0), 0);
    assert_eq!(with(0.0).max_ejected(100), 0);
}

#[test]
fn min_requests_is_rate_times_window_rounded_up() {
    let c = |rate, window| OutlierConfig {
        min_request_rate: rate,
        window: secs(window),
        ..OutlierConfig::default()
    };
    assert_eq!(c(1.0, 10.0).min_requests(), 10);
    assert_eq!(
        c(0.1, 30.0).min_requests(),
        3,
        "f64 gives 3.0000000000000004"
    );
    assert_eq!(c(0.25, 10.0).min_requests(), 3);
    assert_eq!(c(0.0, 10.0).min_requests(), 1, "at least one outcome");
}

#[test]
fn error_kinds() {
    use Outcome::*;
    for kinds in [ErrorKinds::NetworkOnly, ErrorKinds::NetworkAndServerErrors] {
        assert!(!Success.is_error(kinds));
        assert!(ConnectFailure.is_error(kinds));
        assert!(NetworkError.is_error(kinds));
    }
    assert!(!ServerError.is_error(ErrorKinds::NetworkOnly));
    assert!(ServerError.is_error(ErrorKinds::NetworkAndServerErrors));
}

// ---- window arithmetic ----

#[test]
fn window_keeps_the_current_bucket_and_the_nine_before() {
    let mut w = RequestWindow::default();
    w.record(0, true);
    w.record(3, false);
    w.record(9, false);
    let c = w.counts(9);
    assert_eq!((c.requests, c.errors), (3, 1));
    let c = w.counts(10);
    assert_eq!((c.requests, c.errors), (2, 0), "bucket 0 fell out");
    w.record(13, true); // reuses bucket 3's slot
    let c = w.counts(13);
    assert_eq!((c.requests, c.errors), (2, 1), "buckets 9 and 13");
    assert_eq!(w.counts(23).requests, 0);
}

#[tokio::test(start_paused = true)]
async fn old_outcomes_fall_out_of_the_window() {
    let d = detector(rate_only());
    let a = key(0);
    record_n(&d, &a, Outcome::Success, 10, 4);
    advance(secs(9.0)).await;
    record_n(&d, &a, Outcome::NetworkError, 9, 4);
    assert!(!d.is_ejected(&a), "9 errors out of 19");
    // The 10 successes (bucket 0) leave the window at 10 s; the 9 errors stay.
    advance(secs(1.0)).await;
    d.record(&a, Outcome::NetworkError, 4);
    assert!(d.is_ejected(&a), "10 errors out of 10");
    let (_, info) = d.ejected()[0];
    assert_eq!(info.reason, EjectionReason::ErrorRate);
}

#[tokio::test(start_paused = true)]
async fn an_outcome_counts_until_the_window_has_passed() {
    let d = detector(rate_only());
    let a = key(0);
    record_n(&d, &a, Outcome::NetworkError, 6, 4);
    advance(secs(9.999)).await;
    record_n(&d, &a, Outcome::Success, 3, 4);
    assert!(!d.is_ejected(&a), "9 outcomes: below the minimum");
    d.record(&a, Outcome::Success, 4);
    assert!(d.is_ejected(&a), "6 errors out of 10 at 9.999 s");

    let b = key(1);
    record_n(&d, &b, Outcome::NetworkError, 6, 4);
    advance(secs(10.0)).await;
    record_n(&d, &b, Outcome::Success, 4, 4);
    assert!(!d.is_ejected(&b), "the 6 errors left the window after 10 s");
}

// ---- error-rate trigger ----

#[tokio::test(start_paused = true)]
async fn error_rate_waits_for_the_minimum_rate() {
    let d = detector(rate_only());
    let a = key(0);
    record_n(&d, &a, Outcome::NetworkError, 9, 4);
    assert!(!d.is_ejected(&a), "9 requests in 10 s is below 1 req/s");
    d.record(&a, Outcome::NetworkError, 4);
    assert!(d.is_ejected(&a));

    let d = detector(OutlierConfig {
        min_request_rate: 2.0,
        ..rate_only()
    });
    record_n(&d, &a, Outcome::NetworkError, 19, 4);
    assert!(!d.is_ejected(&a), "2 req/s needs 20 requests");
    d.record(&a, Outcome::NetworkError, 4);
    assert!(d.is_ejected(&a));
}

#[tokio::test(start_paused = true)]
async fn error_rate_must_exceed_the_threshold() {
    let d = detector(rate_only());
    let a = key(0);
    record_n(&d, &a, Outcome::Success, 5, 4);
    record_n(&d, &a, Outcome::NetworkError, 5, 4);
    assert!(!d.is_ejected(&a), "5 of 10 equals the threshold");
    d.record(&a, Outcome::NetworkError, 4);
    assert!(d.is_ejected(&a), "6 of 11 exceeds it");
}

#[tokio::test(start_paused = true)]
async fn server_errors_count_only_when_configured() {
    let d = detector(rate_only());
    let a = key(0);
    record_n(&d, &a, Outcome::ServerError, 20, 4);
    assert!(!d.is_ejected(&a), "5xx are not errors by default");

    let d = detector(rate_only().with_errors(ErrorKinds::NetworkAndServerErrors));
    record_n(&d, &a, Outcome::ServerError, 10, 4);
    assert!(d.is_ejected(&a));
}

// ---- consecutive trigger ----

#[tokio::test(start_paused = true)]
async fn consecutive_failures_eject_at_once_and_reset_on_success() {
    let d = detector(streak_only());
    let a = key(0);
    record_n(&d, &a, Outcome::ConnectFailure, 4, 4);
    d.record(&a, Outcome::Success, 4);
    record_n(&d, &a, Outcome::ConnectFailure, 4, 4);
    assert!(!d.is_ejected(&a), "the success reset the streak");
    d.record(&a, Outcome::ConnectFailure, 4);
    assert!(d.is_ejected(&a), "5 in a row");
    assert_eq!(d.ejected()[0].1.reason, EjectionReason::Consecutive);
}

#[tokio::test(start_paused = true)]
async fn only_connect_failures_extend_the_streak() {
    let d = detector(streak_only());
    let a = key(0);
    for outcome in [Outcome::NetworkError, Outcome::ServerError] {
        record_n(&d, &a, Outcome::ConnectFailure, 4, 4);
        d.record(&a, outcome, 4);
    }
    record_n(&d, &a, Outcome::ConnectFailure, 4, 4);
    assert!(
        !d.is_ejected(&a),
        "any answer or sent request resets the streak"
    );

    let d = detector(OutlierConfig {
        consecutive_failures: 0,
        ..streak_only()
    });
    record_n(&d, &a, Outcome::ConnectFailure, 100, 4);
    assert!(!d.is_ejected(&a), "0 disables the trigger");
}

// ---- limits ----

#[tokio::test(start_paused = true)]
async fn six_instances_at_ratio_0_6_eject_at_most_three() {
    let d = detector(streak_only().with_max_ejection_ratio(0.6));
    for i in 0..6 {
        eject(&d, &key(i), 6);
    }
    assert_eq!(d.ejected().len(), 3);
    assert!(d.is_ejected(&key(2)) && !d.is_ejected(&key(3)));
}

#[tokio::test(start_paused = true)]
async fn four_instances_at_ratio_0_2_eject_one() {
    let d = detector(streak_only().with_max_ejection_ratio(0.2));
    for i in 0..4 {
        eject(&d, &key(i), 4);
    }
    assert_eq!(d.ejected().len(), 1, "4 x 0.2 = 0.8: at least one");
    let d = detector(streak_only().with_max_ejection_ratio(0.2));
    for i in 0..10 {
        eject(&d, &key(i), 10);
    }
    assert_eq!(d.ejected().len(), 2, "10 x 0.2 = 2");
}

#[tokio::test(start_paused = true)]
async fn the_last_instance_is_never_ejected() {
    let d = detector(streak_only().with_max_ejection_ratio(1.0));
    eject(&d, &key(0), 2);
    eject(&d, &key(1), 2);
    assert_eq!(d.ejected().len(), 1, "one of two stays");
    assert!(!d.is_ejected(&key(1)));

    let d = detector(streak_only().with_max_ejection_ratio(1.0));
    eject(&d, &key(0), 1);
    assert!(d.ejected().is_empty(), "a single instance stays");
}

#[tokio::test(start_paused = true)]
async fn a_blocked_instance_is_ejected_once_another_recovers() {
    let d = detector(
        streak_only()
            .with_max_ejection_ratio(0.2)
            .with_check(RecoveryCheck::TcpConnect),
    );
    eject(&d, &key(0), 5);
    eject(&d, &key(1), 5);
    assert_eq!(d.ejected().len(), 1);
    advance(DEFAULT_RECOVERY_UNIT).await;
    assert_eq!(d.due_tcp_checks(), [key(0)]);
    d.check_result(&key(0), true);
    d.record(&key(1), Outcome::ConnectFailure, 5);
    assert!(d.is_ejected(&key(1)), "its streak was kept");
}

// ---- recovery schedule ----

#[test]
fn schedule_grows_linearly_up_to_the_cap() {
    let s = RecoverySchedule {
        unit: Duration::from_secs(30),
        max_checks: 3,
    };
    let intervals: Vec<u64> = (1..=6).map(|k| s.interval(k).as_secs()).collect();
    assert_eq!(intervals, [30, 60, 90, 90, 90, 90]);
    assert_eq!(s.interval(0), Duration::from_secs(30));
    let huge = RecoverySchedule {
        unit: Duration::MAX,
        max_checks: 20,
    };
    assert_eq!(huge.interval(20), Duration::MAX, "saturates");
}

#[tokio::test(start_paused = true)]
async fn tcp_checks_follow_the_schedule_and_reset_after_recovery() {
    let d = detector(OutlierConfig {
        max_checks: 3,
        check: RecoveryCheck::TcpConnect,
        ..streak_only()
    });
    let a = key(0);
    let start = Instant::now();
    eject(&d, &a, 4);
    let unit = DEFAULT_RECOVERY_UNIT;

    // Checks come 30, 60, 90, 90 s after the ejection / the previous check.
    for (k, interval) in [1u32, 2, 3, 3, 3].into_iter().enumerate() {
        let info = d.ejected()[0].1;
        assert_eq!(info.checks, k as u32);
        advance(unit * interval - secs(0.001)).await;
        assert!(d.due_tcp_checks().is_empty(), "check {} too early", k + 1);
        advance(secs(0.001)).await;
        assert_eq!(d.due_tcp_checks(), [key(0)], "check {} due", k + 1);
        assert!(d.due_tcp_checks().is_empty(), "handed out once");
        assert!(d.ejected()[0].1.check_in_flight);
        d.check_result(&a, false);
    }
    assert_eq!(Instant::now() - start, unit * (1 + 2 + 3 + 3 + 3));

    advance(unit * 3).await;
    assert_eq!(d.due_tcp_checks(), [key(0)]);
    d.check_result(&a, true);
    assert!(!d.is_ejected(&a), "recovered");
    assert!(d.due_tcp_checks().is_empty());

    // Ejected again: the schedule starts over at one unit.
    eject(&d, &a, 4);
    let info = d.ejected()[0].1;
    assert_eq!(info.checks, 0);
    assert_eq!(info.next_check_at, Instant::now() + unit);
}

#[tokio::test(start_paused = true)]
async fn a_recovered_instance_starts_with_a_fresh_window() {
    let d = detector(streak_only().with_check(RecoveryCheck::TcpConnect));
    let a = key(0);
    record_n(&d, &a, Outcome::ConnectFailure, 5, 4);
    advance(DEFAULT_RECOVERY_UNIT).await;
    d.due_tcp_checks();
    d.check_result(&a, true);
    record_n(&d, &a, Outcome::ConnectFailure, 4, 4);
    assert!(!d.is_ejected(&a), "the old streak is gone");
}

#[tokio::test(start_paused = true)]
async fn lost_tcp_checks_become_due_again() {
    let d = detector(streak_only().with_check(RecoveryCheck::TcpConnect));
    let a = key(0);
    eject(&d, &a, 4);
    advance(DEFAULT_RECOVERY_UNIT).await;
    assert_eq!(d.due_tcp_checks(), [key(0)]);
    advance(DEFAULT_CHECK_TIMEOUT - secs(0.001)).await;
    assert!(d.due_tcp_checks().is_empty(), "still awaited");
    advance(secs(0.001)).await;
    assert_eq!(d.due_tcp_checks(), [key(0)], "lost: due again");
    assert_eq!(d.ejected()[0].1.checks, 0, "a lost check is no failure");
}

#[tokio::test(start_paused = true)]
async fn tcp_mode_never_probes_with_requests() {
    let d = detector(streak_only().with_check(RecoveryCheck::TcpConnect));
    let view = instances(4);
    eject(&d, &view[0].key, 4);
    advance(DEFAULT_RECOVERY_UNIT * 100).await;
    assert_eq!(
        ips(&d.admit(view.iter().collect())),
        ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    );
    d.record(&view[0].key, Outcome::Success, 4);
    assert!(d.is_ejected(&view[0].key), "no probe was admitted");
}

#[tokio::test(start_paused = true)]
async fn check_result_for_an_instance_not_ejected_is_ignored() {
    let d = detector(streak_only());
    d.check_result(&key(0), false);
    d.check_result(&key(0), true);
    assert!(d.ejected().is_empty());
    assert!(
        d.due_tcp_checks().is_empty(),
        "request mode lists no TCP checks"
    );
}

// ---- admission (request checks) ----

#[tokio::test(start_paused = true)]
async fn admit_drops_ejected_instances() {
    let d = detector(streak_only());
    let view = instances(4);
    let all: Vec<&Instance> = view.iter().collect();
    assert_eq!(d.admit(all.clone()).len(), 4);
    eject(&d, &view[1].key, 4);
    assert_eq!(
        ips(&d.admit(all.clone())),
        ["10.0.0.0", "10.0.0.2", "10.0.0.3"]
    );
    assert!(d.admit(Vec::new()).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_due_request_check_admits_exactly_one_probe() {
    let d = detector(streak_only());
    let view = instances(4);
    let all: Vec<&Instance> = view.iter().collect();
    let a = &view[1].key;
    eject(&d, a, 4);

    advance(DEFAULT_RECOVERY_UNIT - secs(0.001)).await;
    assert_eq!(d.admit(all.clone()).len(), 3, "not due yet");
    advance(secs(0.001)).await;
    assert_eq!(ips(&d.admit(all.clone())), ["10.0.0.1"], "the probe alone");
    assert_eq!(d.admit(all.clone()).len(), 3, "only one probe");
    assert!(d.ejected()[0].1.check_in_flight);

    // The probe fails: the next check comes two units later.
    d.record(a, Outcome::ConnectFailure, 4);
    let info = d.ejected()[0].1;
    assert_eq!((info.checks, info.check_in_flight), (1, false));
    assert_eq!(
        info.next_check_at,
        Instant::now() + DEFAULT_RECOVERY_UNIT * 2
    );
    advance(DEFAULT_RECOVERY_UNIT * 2 - secs(0.001)).await;
    assert_eq!(d.admit(all.clone()).len(), 3);
    advance(secs(0.001)).await;
    assert_eq!(ips(&d.admit(all.clone())), ["10.0.0.1"]);

    // The probe succeeds: recovered, every instance is admitted again.
    d.record(a, Outcome::Success, 4);
    assert!(!d.is_ejected(a));
    assert_eq!(d.admit(all).len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_probe_judges_by_the_configured_error_kinds() {
    let d = detector(streak_only());
    let view = instances(4);
    eject(&d, &view[0].key, 4);
    advance(DEFAULT_RECOVERY_UNIT).await;
    assert_eq!(d.admit(view.iter().collect()).len(), 1);
    d.record(&view[0].key, Outcome::ServerError, 4);
    assert!(
        !d.is_ejected(&view[0].key),
        "a 5xx is an answer under NetworkOnly"
    );

    let d = detector(streak_only().with_errors(ErrorKinds::NetworkAndServerErrors));
    eject(&d, &view[0].key, 4);
    advance(DEFAULT_RECOVERY_UNIT).await;
    assert_eq!(d.admit(view.iter().collect()).len(), 1);
    d.record(&view[0].key, Outcome::ServerError, 4);
    assert!(d.is_ejected(&view[0].key));
}

#[tokio::test(start_paused = true)]
async fn outcomes_of_ejected_instances_without_a_probe_are_ignored() {
    let d = detector(streak_only());
    let a = key(0);
    eject(&d, &a, 4);
    d.record(&a, Outcome::Success, 4); // a request sent before the ejection
    assert!(d.is_ejected(&a));
    assert_eq!(d.ejected()[0].1.checks, 0);
}

#[tokio::test(start_paused = true)]
async fn a_lost_probe_is_admitted_again_after_the_check_timeout() {
    let d = detector(streak_only());
    let view = instances(4);
    let all: Vec<&Instance> = view.iter().collect();
    eject(&d, &view[0].key, 4);
    advance(DEFAULT_RECOVERY_UNIT).await;
    assert_eq!(d.admit(all.clone()).len(), 1);
    advance(DEFAULT_CHECK_TIMEOUT - secs(0.001)).await;
    assert_eq!(d.admit(all.clone()).len(), 3);
    advance(secs(0.001)).await;
    assert_eq!(ips(&d.admit(all)), ["10.0.0.0"]);
}

#[tokio::test(start_paused = true)]
async fn admit_fails_open_when_every_candidate_is_ejected() {
    let d = detector(streak_only());
    let view = instances(4);
    eject(&d, &view[0].key, 4);
    eject(&d, &view[1].key, 4);
    // Instances 2 and 3 are gone (or already tried): send to the ejected ones anyway.
    let left = vec![&view[0], &view[1]];
    assert_eq!(ips(&d.admit(left)), ["10.0.0.0", "10.0.0.1"]);
}

// ---- view changes ----

#[tokio::test(start_paused = true)]
async fn instances_that_leave_the_view_are_forgotten() {
    let mut registry = Registry::default();
    let metrics = OutlierMetrics::register(&mut registry);
    let d = detector(streak_only()).with_metrics(metrics.clone());
    eject(&d, &key(0), 4);
    record_n(&d, &key(1), Outcome::ConnectFailure, 4, 4);
    d.retain(&[key(1), key(2), key(3)]);
    assert!(d.ejected().is_empty());
    assert_eq!(gauge(&metrics), 0);

    // Back in the view: a fresh start.
    record_n(&d, &key(0), Outcome::ConnectFailure, 4, 4);
    assert!(!d.is_ejected(&key(0)));
    // Still in the view: its streak is kept.
    d.record(&key(1), Outcome::ConnectFailure, 4);
    assert!(d.is_ejected(&key(1)));
}

// ---- metrics ----

fn gauge(metrics: &OutlierMetrics) -> i64 {
    metrics
        .ejected
        .get_or_create(&ServiceLabels {
            service: ServiceKey::named("svc").to_string(),
        })
        .get()
}

#[tokio::test(start_paused = true)]
async fn ejections_and_recoveries_are_counted() {
    let mut registry = Registry::default();
    let metrics = OutlierMetrics::register(&mut registry);
    let d = detector(OutlierConfig {
        max_ejection_ratio: 0.5,
        check: RecoveryCheck::TcpConnect,
        ..OutlierConfig::default()
    })
    .with_metrics(metrics.clone());
    eject(&d, &key(0), 4);
    record_n(&d, &key(1), Outcome::NetworkError, 10, 4);
    assert_eq!(gauge(&metrics), 2);
    advance(DEFAULT_RECOVERY_UNIT).await;
    assert_eq!(d.due_tcp_checks().len(), 2);
    d.check_result(&key(0), true);
    d.check_result(&key(1), false);
    assert_eq!(gauge(&metrics), 1);

    let mut text = String::new();
    encode(&mut text, &registry).expect("encode");
    let service = ServiceKey::named("svc").to_string();
    for line in [
        format!(
            "gangway_outlier_ejections_total{{service=\"{service}\",reason=\"consecutive\"}} 1"
        ),
        format!("gangway_outlier_ejections_total{{service=\"{service}\",reason=\"error_rate\"}} 1"),
        format!("gangway_outlier_recoveries_total{{service=\"{service}\"}} 1"),
        format!("gangway_outlier_ejected{{service=\"{service}\"}} 1"),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
    }

    drop(d);
    assert_eq!(gauge(&metrics), 0, "a dropped detector ejects nothing");
}

#[test]
fn reasons_as_labels() {
    assert_eq!(EjectionReason::ErrorRate.to_string(), "error_rate");
    assert_eq!(EjectionReason::Consecutive.as_str(), "consecutive");
}

#[test]
fn the_detector_is_shareable() {
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<OutlierDetector>();
    shareable::<OutlierMetrics>();
}
