use std::time::Duration;

use super::*;

#[test]
fn connect_failures_are_always_retried() {
    assert!(may_retry(Failure::Connect, false));
    assert!(may_retry(Failure::Connect, true));
}

#[test]
fn failures_after_sending_need_idempotency() {
    for failure in [
        Failure::AfterSend,
        Failure::Status(502),
        Failure::Status(503),
        Failure::Status(504),
    ] {
        assert!(may_retry(failure, true), "{failure:?}");
        assert!(!may_retry(failure, false), "{failure:?}");
    }
    for status in [500, 501, 505, 404, 429] {
        assert!(!may_retry(Failure::Status(status), true), "{status}");
    }
}

#[test]
fn idempotent_methods_follow_rfc_9110() {
    use http::Method;
    for m in [
        Method::GET,
        Method::HEAD,
        Method::PUT,
        Method::DELETE,
        Method::OPTIONS,
        Method::TRACE,
    ] {
        assert!(is_idempotent(&m), "{m}");
    }
    for m in [Method::POST, Method::PATCH, Method::CONNECT] {
        assert!(!is_idempotent(&m), "{m}");
    }
}

#[test]
fn config_problems_are_all_reported() {
    assert!(RetryConfig::default().problems().is_empty());
    let bad = RetryConfig::default()
        .with_max_attempts(0)
        .with_budget(Duration::from_millis(10), 10, -1.0)
        .with_per_try_timeout(Duration::ZERO);
    assert_eq!(bad.problems().len(), 4, "{:?}", bad.problems());
}

#[tokio::test(start_paused = true)]
async fn the_floor_allows_ten_retries_per_second_without_requests() {
    let budget = RetryBudget::new(&RetryConfig::default());
    let granted = (0..1000).take_while(|_| budget.withdraw()).count();
    // 10/s over a 10 s window.
    assert_eq!(granted, 100);
    assert!(!budget.withdraw(), "exhausted");
}

#[tokio::test(start_paused = true)]
async fn twenty_percent_of_requests_on_top_of_the_floor() {
    let config = RetryConfig::default().with_budget(Duration::from_secs(10), 0, 0.2);
    let budget = RetryBudget::new(&config);
    for _ in 0..1000 {
        budget.deposit();
    }
    let granted = (0..1000).take_while(|_| budget.withdraw()).count();
    assert_eq!(granted, 200, "20 % of 1000 requests");
}

#[tokio::test(start_paused = true)]
async fn the_budget_refills_as_the_window_slides() {
    let config = RetryConfig::default().with_budget(Duration::from_secs(10), 0, 0.2);
    let budget = RetryBudget::new(&config);
    for _ in 0..100 {
        budget.deposit();
    }
    assert_eq!((0..100).take_while(|_| budget.withdraw()).count(), 20);
    tokio::time::sleep(Duration::from_secs(11)).await;
    for _ in 0..50 {
        budget.deposit();
    }
    assert_eq!(
        (0..100).take_while(|_| budget.withdraw()).count(),
        10,
        "old deposits expired"
    );
}

#[tokio::test(start_paused = true)]
async fn stats_count_requests_granted_and_refused_retries() {
    let config = RetryConfig::default().with_budget(Duration::from_secs(10), 0, 0.2);
    let budget = RetryBudget::new(&config);
    let clone = budget.clone();
    for _ in 0..10 {
        clone.deposit();
    }
    let granted = (0..5).filter(|_| budget.withdraw()).count();
    assert_eq!(granted, 2, "20 % of 10 requests");
    let stats = budget.stats();
    assert_eq!(stats.requests, 10);
    assert_eq!(stats.retries, 2);
    assert_eq!(stats.refused, 3);
    assert_eq!(clone.stats(), stats, "clones share the counters");
}
