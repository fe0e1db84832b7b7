//! End to end, the consumer side (issue #3): a registry, three demo-service processes and a
//! demo-client at 60 req/s for 8 s (480 requests) with the consumer pipeline on. Prints the
//! three results as one table.

mod cluster;

use std::time::Duration;

use cluster::Run;
use nix::sys::signal::Signal;
use serde_json::Value;

const ACTION_AT: Duration = Duration::from_secs(3);

struct Outcome {
    scenario: &'static str,
    sent: u64,
    failed: u64,
    attempts: f64,
    detail: String,
}

fn requests(report: &Value) -> &Vec<Value> {
    report["requests"].as_array().expect("requests")
}

fn to(r: &Value, addr: &str) -> bool {
    r["instance"].as_str() == Some(addr)
}

fn summary(scenario: &'static str, report: &Value, detail: String) -> Outcome {
    Outcome {
        scenario,
        sent: report["sent"].as_u64().unwrap(),
        failed: report["failed"].as_u64().unwrap(),
        attempts: report["attempts_per_request"].as_f64().unwrap(),
        detail,
    }
}

async fn sigkill_with_retry() -> Outcome {
    let mut run = Run::setup(&[], &[], &[]).await;
    tokio::time::sleep_until(run.started + ACTION_AT).await;
    let victim = run.services.remove(0);
    victim.proc.signal(Signal::SIGKILL);
    let report = run.finish().await;
    let retried = requests(&report)
        .iter()
        .filter(|r| r["attempts"].as_u64() == Some(2))
        .count();
    let out = summary(
        "(a) SIGKILL, one retry",
        &report,
        format!("{retried} request(s) retried"),
    );
    assert_eq!(out.sent, 480);
    assert_eq!(out.failed, 0, "retry must cover a crash: {report}");
    assert!(
        out.attempts <= 1.05,
        "attempts/request {} > 1.05",
        out.attempts
    );
    out
}

async fn failing_instance_is_ejected_and_recovers() -> Outcome {
    // 3 instances: floor(3 x 0.5) = 1 may be ejected (the default 0.2 would allow none).
    let client = [
        "--eject-errors",
        "network-and5xx",
        "--eject-max-ratio",
        "0.5",
        "--recovery-unit",
        "1s",
    ];
    let mut run = Run::setup(&[], &["--fail"], &client).await;
    let sick = run.services[0].addr.clone();
    tokio::time::sleep_until(run.started + ACTION_AT).await;
    let healed_ms = run.started.elapsed().as_secs_f64() * 1000.0;
    let healed = reqwest::Client::new()
        .post(format!("http://{sick}/control/heal"))
        .send()
        .await
        .unwrap();
    assert!(healed.status().is_success());
    let report = run.finish().await;
    let to_sick: Vec<&Value> = requests(&report).iter().filter(|r| to(r, &sick)).collect();
    // Ejected: after the first burst, requests to the sick instance stop (only recovery checks).
    let burst_end = to_sick
        .windows(2)
        .find(|w| w[1]["sent_ms"].as_f64().unwrap() - w[0]["sent_ms"].as_f64().unwrap() > 500.0)
        .map(|w| w[0]["sent_ms"].as_f64().unwrap())
        .expect("requests to the failing instance stopped (ejection)");
    assert!(
        burst_end < 10_000.0,
        "ejected {burst_end:.0} ms in: not within one window"
    );
    let back = to_sick
        .iter()
        .find(|r| r["ok"] == true && r["sent_ms"].as_f64().unwrap() >= healed_ms)
        .map(|r| r["sent_ms"].as_f64().unwrap() - healed_ms)
        .expect("the healed instance came back");
    // Checks come 1 s, 2 s, 3 s ... apart: healed ~2.5 s after the ejection, back within 3 s.
    assert!(back <= 3_000.0, "back {back:.0} ms after healing");
    let served_after = to_sick.iter().filter(|r| r["ok"] == true).count();
    assert!(
        served_after >= 10,
        "the recovered instance takes traffic again ({served_after} ok)"
    );
    let out = summary(
        "(b) HTTP 500 on one instance, 5xx count",
        &report,
        format!(
            "ejected by {burst_end:.0} ms; back {back:.0} ms after healing; {served_after} ok from it after"
        ),
    );
    assert!(
        out.failed > 0 && out.failed < 40,
        "failures are the 500s before ejection and the checks: {}",
        out.failed
    );
    out
}

async fn drained_keep_alive_connection() -> Outcome {
    let mut run = Run::setup(&[], &[], &[]).await;
    tokio::time::sleep_until(run.started + ACTION_AT).await;
    let victim = run.services.remove(0);
    let addr = victim.addr.clone();
    let mut proc = victim.proc;
    proc.signal(Signal::SIGTERM);
    proc.line_starting("drained ").await;
    assert!(proc.wait(Duration::from_secs(10)).await.success());
    let report = run.finish().await;
    let to_victim: Vec<&Value> = requests(&report).iter().filter(|r| to(r, &addr)).collect();
    let connections: std::collections::BTreeSet<&str> = to_victim
        .iter()
        .filter_map(|r| r["connection"].as_str())
        .collect();
    // Keep-alive: far fewer connections than requests.
    assert!(
        to_victim.len() >= 40,
        "{} requests went to the drained instance",
        to_victim.len()
    );
    assert!(
        connections.len() * 4 <= to_victim.len(),
        "{} connections for {} requests",
        connections.len(),
        to_victim.len()
    );
    let left_view = report["view_changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["at_ms"].as_f64().unwrap() > 1000.0
                && !c["instances"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|i| i.as_str() == Some(addr.as_str()))
        })
        .map(|c| c["at_ms"].as_f64().unwrap())
        .expect("the drained instance left the view");
    let after: Vec<&&Value> = to_victim
        .iter()
        .filter(|r| r["sent_ms"].as_f64().unwrap() > left_view)
        .collect();
    assert!(
        after.is_empty(),
        "requests sent after the instance left the view still went to it: {after:?}"
    );
    let out = summary(
        "(c) keep-alive connection, instance drained",
        &report,
        format!(
            "{} requests over {} connection(s) before it left the view at {left_view:.0} ms; none after",
            to_victim.len(),
            connections.len()
        ),
    );
    assert_eq!(out.failed, 0, "{report}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_ejection_and_connection_draining() {
    let outcomes = vec![
        sigkill_with_retry().await,
        failing_instance_is_ejected_and_recovers().await,
        drained_keep_alive_connection().await,
    ];
    let mut table = comfy_table::Table::new();
    table.set_header(["scenario", "sent", "failed", "attempts/request", "detail"]);
    for o in &outcomes {
        table.add_row([
            o.scenario.to_owned(),
            o.sent.to_string(),
            o.failed.to_string(),
            format!("{:.3}", o.attempts),
            o.detail.clone(),
        ]);
    }
    println!("{table}");
}
