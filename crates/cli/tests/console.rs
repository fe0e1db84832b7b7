//! The web console end to end (docs/console.md): `gangway server --auth FILE` as a real process
//! on 127.0.0.1, instances kept alive by a client session, and tests/console/console_e2e.py
//! driving Debian's headless Chromium through PyPI selenium: sign in, list, offline an
//! instance, drain one and see the drain wait for a lagging poller and complete, see the
//! refusal to drain a last serving instance, sign out. Screenshots land in
//! target/console-shots/.
//!
//! scripts/test.sh installs Chromium, its driver and selenium (in target/console-venv) and sets
//! `GANGWAY_CONSOLE_E2E=require`; without that variable a machine lacking them skips the test
//! with a loud message instead of failing it.

mod cluster;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cluster::{Server, gangway_auth};
use gangway_client::{Client, ClientConfig};
use gangway_core::model::{InstanceKey, ServiceKey};
use serde_json::{Value, json};

/// Longest run of the browser script (it takes about 10 s).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

/// The build's target directory (the venv and the screenshots live there).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target/tmp has a parent")
        .to_owned()
}

/// What the browser test runs with.
struct Kit {
    python: PathBuf,
    chromium: PathBuf,
    chromedriver: PathBuf,
}

/// Finds Python with selenium, Chromium and its driver; `Err` says what is missing.
fn browser_kit() -> Result<Kit, String> {
    let python = target_dir().join("console-venv/bin/python");
    let chromium = PathBuf::from("/usr/bin/chromium");
    let chromedriver = PathBuf::from("/usr/bin/chromedriver");
    for (what, path) in [
        ("Debian chromium", &chromium),
        ("Debian chromium-driver", &chromedriver),
        ("the console venv", &python),
    ] {
        if !path.exists() {
            return Err(format!("{what} is missing ({})", path.display()));
        }
    }
    let import = std::process::Command::new(&python)
        .args(["-c", "import selenium"])
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !import.status.success() {
        return Err(format!("selenium is not installed in {}", python.display()));
    }
    Ok(Kit {
        python,
        chromium,
        chromedriver,
    })
}

async fn get(http: &reqwest::Client, server: &Server, token: &str, path: &str) -> Value {
    http.get(server.url(path))
        .bearer_auth(token)
        .send()
        .await
        .expect("GET")
        .json()
        .await
        .expect("JSON")
}

fn instance<'a>(list: &'a Value, addr: &str) -> &'a Value {
    list["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| format!("{}:{}", i["ip"].as_str().unwrap(), i["port"]) == addr)
        .unwrap_or_else(|| panic!("no {addr} in {list}"))
}

#[tokio::test]
async fn the_console_in_headless_chromium_signs_in_lists_drains_and_shows_a_refusal() {
    let kit = match browser_kit() {
        Ok(kit) => kit,
        Err(why) if std::env::var("GANGWAY_CONSOLE_E2E").as_deref() == Ok("require") => {
            panic!("the console's browser test cannot run: {why}")
        }
        Err(why) => {
            eprintln!(
                "\n!!!!!!!! SKIPPED: the web console's browser test did not run: {why}.\n\
                 !!!!!!!! scripts/test.sh installs Debian chromium and chromium-driver and PyPI \
                 selenium (target/console-venv).\n"
            );
            return;
        }
    };
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("auth.toml");
    let auth = |args: &[&str], stdin: &str| gangway_auth(&file, args, stdin);
    let add = [
        "user",
        "add",
        "ada",
        "--role",
        "admin",
        "--namespace",
        "public",
    ];
    auth(&add, "ada-console-pw\n");
    let token = |role, description| {
        auth(
            &[
                "token",
                "create",
                "--role",
                role,
                "--namespace",
                "public",
                "--description",
                description,
            ],
            "",
        )
    };
    let writer = token("write", "the instances");
    let reader = token("read", "a lagging poller");
    let data = dir.path().join("data");
    let server = Server::start(
        &data,
        "127.0.0.1:0",
        "127.0.0.1:0",
        &["--auth", file.to_str().unwrap()],
    )
    .await;

    // Instances kept alive by one client session (so no lease expires during the test), which
    // also subscribes to `orders` and acks at once; a persistent one whose probe fails.
    let client = Client::connect(
        ClientConfig::new(format!("http://{}", server.grpc))
            .with_token(writer.clone())
            .with_client_name("orders-app"),
    )
    .await
    .expect("client session");
    let mut registrations = Vec::new();
    for (service, ip, version) in [
        ("orders", "10.0.0.1", "2.4.1"),
        ("orders", "10.0.0.2", "2.4.1"),
        ("orders", "10.0.0.3", "2.5.0"),
        ("payments", "10.0.1.1", "1.9.0"),
    ] {
        let meta = BTreeMap::from([
            ("version".to_owned(), version.to_owned()),
            ("zone".to_owned(), "eu-west-1a".to_owned()),
        ]);
        let r = client
            .register(
                ServiceKey::named(service),
                InstanceKey::new(ip, 8080, ""),
                1.0,
                meta,
            )
            .await
            .expect("register");
        registrations.push(r);
    }
    let _subscription = client
        .subscribe(ServiceKey::named("orders"))
        .await
        .expect("subscribe");
    let http = reqwest::Client::new();
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let stock = http
        .post(server.url("/v1/services/stock/instances"))
        .bearer_auth(&writer)
        .json(
            &json!({"ip": "127.0.0.1", "port": closed_port, "ephemeral": false,
                      "probe": {"interval_ms": 500, "fall": 1}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(stock.status(), reqwest::StatusCode::OK);
    // The poller the script makes lag: it fetches once now, then only when the script says.
    get(
        &http,
        &server,
        &reader,
        "/v1/services/orders/instances?subscriber=lagging-web",
    )
    .await;

    let shots = target_dir().join("console-shots");
    std::fs::create_dir_all(&shots).unwrap();
    for old in std::fs::read_dir(&shots).unwrap() {
        std::fs::remove_file(old.unwrap().path()).unwrap();
    }
    let config = json!({
        "url": format!("http://{}", server.http),
        "user": "ada",
        "password": "ada-console-pw",
        "poller_token": reader,
        "shots_dir": shots,
        "chromium": kit.chromium,
        "chromedriver": kit.chromedriver,
        "service": "orders",
        "services": ["orders", "payments", "stock"],
        "instances": 3,
        "serving": 3,
        "offline_addr": "10.0.0.3:8080",
        "drain_addr": "10.0.0.2:8080",
        "last_service": "payments",
        "last_addr": "10.0.1.1:8080",
    });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/console/console_e2e.py");
    let run = tokio::process::Command::new(&kit.python)
        .arg(&script)
        .env("CONSOLE_E2E", config.to_string())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(SCRIPT_TIMEOUT, run)
        .await
        .expect("the browser script ended in time")
        .expect("run the browser script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .expect("a JSON summary line");
    assert_eq!(summary["ok"], true, "{}", summary["error"]);
    assert!(out.status.success());
    let steps: Vec<&str> = summary["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap())
        .collect();
    assert_eq!(
        steps,
        [
            "login-form",
            "logged-in",
            "services-listed",
            "service-opened",
            "offlined",
            "drain-waiting",
            "drain-complete",
            "refused",
            "signed-out"
        ]
    );
    let step = |name: &str| {
        summary["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["step"] == name)
            .unwrap()
            .clone()
    };
    let waiting = step("drain-waiting")["progress"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(waiting.contains("1 / 2 acked"), "{waiting}");
    let complete = step("drain-complete");
    assert!(
        complete["progress"]
            .as_str()
            .unwrap()
            .contains("2 / 2 acked"),
        "{complete}"
    );
    let refusal = step("refused")["toast"].as_str().unwrap().to_owned();
    assert!(refusal.contains("409 conflict"), "{refusal}");
    for name in [
        "01-login",
        "02-services",
        "03-drain-waiting",
        "04-drain-complete",
        "05-refused",
    ] {
        let png = std::fs::read(shots.join(format!("{name}.png"))).expect("screenshot");
        assert!(png.starts_with(b"\x89PNG"), "{name} is a PNG");
    }

    // What the page did, as the registry saw it.
    let orders = get(&http, &server, &reader, "/v1/services/orders/liveness").await;
    assert_eq!(instance(&orders, "10.0.0.3:8080")["state"], "offline");
    assert_eq!(instance(&orders, "10.0.0.2:8080")["state"], "offline");
    assert_eq!(instance(&orders, "10.0.0.1:8080")["state"], "serving");
    let payments = get(&http, &server, &reader, "/v1/services/payments/liveness").await;
    assert_eq!(instance(&payments, "10.0.1.1:8080")["state"], "serving");
    let drains = get(&http, &server, &reader, "/v1/drains").await;
    let drain = &drains["drains"][0];
    assert_eq!(
        (
            drain["state"].clone(),
            drain["instance"]["ip"].clone(),
            drain["acked"].clone(),
            drain["total"].clone()
        ),
        (json!("complete"), json!("10.0.0.2"), json!(2), json!(2)),
        "{drains}"
    );
    eprintln!(
        "console e2e: {} steps in {} ms of browser time, drain click to complete {} ms, \
         whole test {} ms; screenshots in {}",
        steps.len(),
        summary["steps"].as_array().unwrap().last().unwrap()["at_ms"],
        complete["click_to_complete_ms"],
        started.elapsed().as_millis(),
        shots.display()
    );
    client.close();
}
