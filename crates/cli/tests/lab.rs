//! `gangway lab` with real processes: the rows issue 4 pins, and the `--json` output.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

const GANGWAY: &str = env!("CARGO_BIN_EXE_gangway");

/// Runs `gangway lab --scenario ...` with the default 480 requests; returns the one scenario's
/// JSON result after checking the file holds one record per request.
async fn scenario(args: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("lab.json");
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new(GANGWAY)
            .arg("lab")
            .args(args)
            .args(["--no-progress", "--json"])
            .arg(&json)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("lab finished in time")
    .expect("lab ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "gangway lab {args:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let run: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).expect("JSON parses");
    let scenarios = run["scenarios"].as_array().expect("scenarios");
    assert_eq!(scenarios.len(), 1, "{stdout}");
    let result = scenarios[0]["result"].clone();
    let requests = result["load"]["requests"].as_array().expect("requests");
    assert_eq!(requests.len(), 480, "one record per request");
    assert_eq!(result["total"], 480);
    for (i, r) in requests.iter().enumerate() {
        assert_eq!(r["index"], i);
        assert!(r["sent_ms"].is_f64() && r["ok"].is_boolean() && r["attempts"].is_u64());
    }
    let failed = requests.iter().filter(|r| r["ok"] == false).count();
    assert_eq!(result["failed"], failed);
    eprintln!("{stdout}");
    result
}

#[tokio::test]
async fn classic_crash_ttl_2s_refresh_1s_loses_about_twenty_per_second_until_the_cache_drops_it() {
    let r = scenario(&[
        "--scenario",
        "crash",
        "--registry",
        "classic",
        "--ttl",
        "2s",
        "--refresh",
        "1s",
    ])
    .await;
    let failed = r["failed"].as_u64().unwrap();
    assert!((30..=55).contains(&failed), "{failed} of 480 failed");
    assert!(
        r["cache_drop_ms"].as_f64().is_some(),
        "the cache never dropped it"
    );
}

#[tokio::test]
async fn gangway_drain_then_graceful_exit_loses_nothing() {
    let r = scenario(&["--scenario", "drain", "--registry", "gangway"]).await;
    assert_eq!(r["failed"], 0);
    let wait = r["drain_wait_ms"].as_u64().expect("drain wait reported");
    assert!(wait < 1000, "drain waited {wait} ms");
}

#[tokio::test]
async fn gangway_crash_with_one_retry_loses_nothing() {
    let r = scenario(&["--scenario", "crash", "--registry", "gangway", "--retry"]).await;
    assert_eq!(r["failed"], 0);
    let attempts = r["attempts_per_request"].as_f64().unwrap();
    assert!(attempts <= 1.05, "{attempts} attempts per request");
}

#[tokio::test]
async fn bad_flags_are_usage_errors() {
    let out = tokio::process::Command::new(GANGWAY)
        .args(["lab", "--rate", "fast"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = tokio::process::Command::new(GANGWAY)
        .args(["lab", "--action-at", "9s"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--action-at"));
}

#[tokio::test]
async fn liveness_prints_every_row() {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(GANGWAY)
            .args(["lab", "liveness", "--observe", "2s", "--no-progress"])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("liveness finished in time")
    .expect("liveness ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("| ")).collect();
    // Header + 3 session rows + lease + 2 persistent + 4 protect + 2 restart.
    assert_eq!(rows.len(), 13, "{stdout}");
    let kill = rows
        .iter()
        .find(|r| r.contains("SIGKILL of its process") && r.contains("session"))
        .unwrap();
    let gone: f64 = kill
        .split("gone after ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(gone < 1.0, "{kill}");
    assert!(stdout.contains("view holds 5 (1 healthy)"), "{stdout}");
    assert!(!stdout.contains("error"), "{stdout}");
}
