use std::io::Write as _;

use gangway_client::outlier::ErrorKinds;

use super::*;

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

fn load(text: &str) -> Result<Config, ConfigError> {
    let f = file(text);
    Config::load(Some(f.path()), &Overrides::default())
}

#[test]
fn no_file_gives_the_client_defaults() {
    let c = Config::from_overrides(&Overrides::default()).unwrap();
    assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(c.admin.unwrap().to_string(), DEFAULT_ADMIN);
    assert_eq!(c.registry, DEFAULT_REGISTRY);
    assert_eq!(c.shutdown_timeout, Duration::from_secs(30));
    let d = &c.routing.defaults;
    assert_eq!(**d, ServiceSettings::default());
    assert_eq!(d.retry.max_attempts, 2);
    assert_eq!(d.retry.retry_ratio, 0.2);
    assert_eq!(d.outlier.as_ref().unwrap().consecutive_failures, 5);
    assert_eq!(d.attempt_timeout, Duration::from_secs(10));
    assert!(d.is_idempotent(&Method::PUT) && !d.is_idempotent(&Method::POST));
    assert_eq!(c.routing.max_request_body, 1 << 20);
}

#[test]
fn a_service_table_overrides_the_defaults_field_by_field() {
    let c = load(
        r#"
        namespace = "prod"
        [defaults]
        connect_timeout = "500ms"
        [defaults.retry]
        max_attempts = 3
        [services.orders]
        balancer = "p2c"
        idempotent_methods = ["GET", "POST"]
        [services.orders.retry]
        retry_ratio = 0.5
        [services.orders.outlier]
        errors = "network-and-5xx"
        max_ejection_ratio = 0.5
        [services.stock.outlier]
        enabled = false
        [services.stock.retry]
        enabled = false
        "#,
    )
    .unwrap();
    let orders = &c.routing.services["orders"];
    assert_eq!(
        orders.key,
        ServiceKey::new("prod", "DEFAULT_GROUP", "orders")
    );
    let s = &orders.settings;
    assert_eq!(s.balancer, BalancerKind::PowerOfTwoChoices);
    assert_eq!(
        s.connect_timeout,
        Duration::from_millis(500),
        "from [defaults]"
    );
    assert_eq!(s.retry.max_attempts, 3, "from [defaults.retry]");
    assert_eq!(s.retry.retry_ratio, 0.5);
    assert!(s.is_idempotent(&Method::POST) && !s.is_idempotent(&Method::PUT));
    let o = s.outlier.as_ref().unwrap();
    assert_eq!(o.errors, ErrorKinds::NetworkAndServerErrors);
    assert_eq!(o.max_ejection_ratio, 0.5);
    assert_eq!(o.window, Duration::from_secs(10), "the client's default");
    let stock = &c.routing.services["stock"].settings;
    assert!(stock.outlier.is_none());
    assert_eq!(stock.retry.max_attempts, 1);
}

#[test]
fn hosts_route_to_tables_aliases_and_defaults() {
    let c = load(
        r#"
        [services.orders]
        balancer = "random"
        [services.java]
        service = "com.example.Orders"
        group = "shop"
        [services."pay.billing.prod"]
        balancer = "weighted"
        "#,
    )
    .unwrap();
    let r = &c.routing;
    let (key, s) = r.route("orders").unwrap();
    assert_eq!(key, ServiceKey::named("orders"));
    assert_eq!(s.balancer, BalancerKind::Random);
    let (key, _) = r.route("java").unwrap();
    assert_eq!(key, ServiceKey::new("public", "shop", "com.example.Orders"));
    // The same service named in full gets the table's settings too.
    let (key, s) = r.route("orders.DEFAULT_GROUP.public").unwrap();
    assert_eq!(key, ServiceKey::named("orders"));
    assert_eq!(s.balancer, BalancerKind::Random);
    let (key, s) = r.route("pay.billing.prod").unwrap();
    assert_eq!(key, ServiceKey::new("prod", "billing", "pay"));
    assert_eq!(s.balancer, BalancerKind::Weighted);
    let (_, s) = r.route("other").unwrap();
    assert_eq!(*s, ServiceSettings::default());
    assert!(r.route("a.b.c.d").is_err());
}

#[test]
fn every_problem_is_reported_and_names_its_field() {
    let Err(ConfigError::Invalid { problems, .. }) = load(
        r#"
        listen = "nowhere"
        max_services = 0
        [defaults]
        balancer = "fastest"
        connect_timeout = "0s"
        service = "x"
        [services.orders.retry]
        max_attempts = 0
        [services.orders.outlier]
        error_rate_threshold = 2.0
        check = "ping"
        [services."a.b.c.d"]
        "#,
    ) else {
        panic!("accepted")
    };
    let expect = [
        "listen: expected IP:PORT",
        "max_services: must be 1-65536, got 0",
        "defaults.service: only a [services.NAME] table",
        "defaults.balancer: expected round-robin",
        "defaults.connect_timeout: must be > 0",
        "services.orders.retry.max_attempts: must be 1-10, got 0",
        "services.orders.outlier.check: expected request or tcp",
        "services.orders.outlier.error_rate_threshold: 2 is not within 0..=1",
        "services.a.b.c.d: host \"a.b.c.d\" has 4 dot-separated parts",
    ];
    for e in expect {
        assert!(
            problems.iter().any(|p| p.starts_with(e)),
            "{e:?} missing from {problems:#?}"
        );
    }
    assert_eq!(problems.len(), expect.len(), "{problems:#?}");
}

#[test]
fn unknown_keys_and_bad_toml_are_one_line_errors_naming_the_key() {
    let e = load("[defaults]\nwarmup = \"30s\"\n").unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, ConfigError::Syntax { .. }), "{e:?}");
    assert!(text.contains("warmup"), "{text}");
    assert!(!text.contains('\n'), "one line: {text}");
    let e = load("[defaults\n").unwrap_err();
    assert!(matches!(e, ConfigError::Syntax { .. }));
    let missing = Config::load(
        Some(Path::new("/nonexistent/proxy.toml")),
        &Overrides::default(),
    );
    assert!(matches!(missing, Err(ConfigError::Read { .. })));
}

#[test]
fn a_service_listed_twice_is_one_line_naming_both_tables() {
    // The same table twice is TOML's own error; two names for one service are ours.
    let e = load("[services.orders]\n[services.orders]\n").unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, ConfigError::Syntax { .. }), "{e:?}");
    assert!(text.contains("orders") && !text.contains('\n'), "{text}");
    let e = load(
        "[services.orders]\n[services.\"orders.DEFAULT_GROUP\"]\n[services.o]\nservice = \"orders\"\n",
    )
    .unwrap_err();
    let text = e.to_string();
    println!("{text}");
    assert!(!text.contains('\n'), "one line: {text}");
    let ConfigError::Invalid { problems, .. } = e else {
        panic!("{e:?}")
    };
    assert_eq!(problems.len(), 2, "{problems:#?}");
    for p in &problems {
        assert!(
            p.contains("routes to public/DEFAULT_GROUP/orders like services.")
                && p.contains("list each service once"),
            "{p}"
        );
    }
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("services.orders.DEFAULT_GROUP: ")
                || p.starts_with("services.orders: ")),
        "{problems:#?}"
    );
}

#[test]
fn flags_win_over_the_file() {
    let f = file("listen = \"127.0.0.1:1\"\nadmin = \"127.0.0.1:2\"\nnamespace = \"a\"\n");
    let mut o = Overrides {
        listen: Some("127.0.0.1:3".parse().unwrap()),
        admin: Some(None),
        namespace: Some("b".into()),
        ..Overrides::default()
    };
    let c = Config::load(Some(f.path()), &o).unwrap();
    assert_eq!(c.listen.port(), 3);
    assert_eq!(c.admin, None);
    assert_eq!(c.routing.namespace, "b");
    o.group = Some("bad group".into());
    assert!(Config::load(Some(f.path()), &o).is_err());
}
