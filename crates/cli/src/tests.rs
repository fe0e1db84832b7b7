use clap::CommandFactory;
use clap::error::ErrorKind;
use gangway_core::model::ProbeKind;
use gangway_wire::client::RestError;

use super::*;

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("gangway").chain(args.iter().copied()))
}

#[test]
fn the_command_line_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn register_takes_metadata_weight_and_lease_settings() {
    let cli = parse(&[
        "register",
        "orders",
        "10.0.0.5:8080",
        "--meta",
        "zone=a",
        "-m",
        "v=1=2",
        "--weight",
        "2.5",
        "--ttl",
        "15",
        "--delete-timeout",
        "1m",
        "--cluster",
        "east",
        "-n",
        "prod",
    ])
    .unwrap();
    let Command::Register(args) = cli.command else {
        panic!("not register")
    };
    let req = args.request().unwrap();
    assert_eq!(req.ip, "10.0.0.5");
    assert_eq!(req.port, 8080);
    assert_eq!(req.weight, Some(2.5));
    assert_eq!(req.ttl_ms, Some(15_000));
    assert_eq!(req.delete_timeout_ms, Some(60_000));
    assert_eq!(req.cluster.as_deref(), Some("east"));
    assert_eq!(req.ephemeral, Some(true));
    assert_eq!(req.metadata.get("v").map(String::as_str), Some("1=2"));
    assert_eq!(args.instance.service.namespace.as_deref(), Some("prod"));
}

#[test]
fn a_metadata_key_given_twice_is_a_usage_error() {
    let cli = parse(&[
        "register",
        "orders",
        "10.0.0.5:80",
        "-m",
        "a=1",
        "-m",
        "a=2",
    ])
    .unwrap();
    let Command::Register(args) = cli.command else {
        panic!("not register")
    };
    let err = args.request().unwrap_err();
    assert_eq!(err.exit_code(), EXIT_USAGE);
    assert_eq!(err.to_string(), "--meta: key \"a\" given twice");
}

#[test]
fn probe_path_implies_an_http_probe_and_needs_persistent() {
    let cli = parse(&[
        "register",
        "db",
        "10.0.0.5:80",
        "--persistent",
        "--probe-path",
        "/ready",
    ])
    .unwrap();
    let Command::Register(args) = cli.command else {
        panic!("not register")
    };
    let req = args.request().unwrap();
    assert_eq!(req.ephemeral, Some(false));
    let probe = req.probe.unwrap();
    assert_eq!(
        (probe.kind, probe.path.as_deref()),
        (Some(ProbeKind::Http), Some("/ready"))
    );

    let err = parse(&["register", "db", "10.0.0.5:80", "--probe", "tcp"]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
    let cli = parse(&[
        "register",
        "db",
        "10.0.0.5:80",
        "--persistent",
        "--probe",
        "tcp",
        "--probe-path",
        "/",
    ])
    .unwrap();
    let Command::Register(args) = cli.command else {
        panic!("not register")
    };
    assert!(
        args.request()
            .unwrap_err()
            .to_string()
            .contains("--probe http")
    );
}

#[test]
fn lease_settings_conflict_with_persistent() {
    let err = parse(&[
        "register",
        "db",
        "10.0.0.5:80",
        "--persistent",
        "--ttl",
        "5",
    ])
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ArgumentConflict);
}

#[test]
fn bad_arguments_are_value_errors_naming_the_argument() {
    for (args, needle) in [
        (
            &["deregister", "orders", "10.0.0.5"][..],
            "'<IP:PORT>': missing :PORT",
        ),
        (
            &["drain", "orders", "10.0.0.5:0"][..],
            "'[IP:PORT]': port: must be 1-65535, got 0",
        ),
        (
            &["register", "orders", "1.2.3.4:80", "-m", "nokey"][..],
            "'--meta <K=V>'",
        ),
        (
            &["drain", "orders", "1.2.3.4:80", "--timeout", "soon"][..],
            "'--timeout <S>'",
        ),
    ] {
        let err = parse(args).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation, "{args:?}");
        let text = err.render().to_string();
        assert!(
            text.lines().next().unwrap().contains(needle),
            "{args:?}: {text}"
        );
    }
}

#[test]
fn global_flags_go_before_or_after_the_command() {
    let cli = parse(&["list", "orders", "--json", "--server", "10.1.1.1:9000"]).unwrap();
    assert!(cli.json);
    assert_eq!(cli.server, "10.1.1.1:9000");
    let cli = parse(&["--server", "h:1", "services"]).unwrap();
    assert_eq!(cli.server, "h:1");
    assert!(!cli.json);
}

#[test]
fn drain_timeout_defaults_to_30s_and_offline_timeout_needs_wait() {
    let cli = parse(&["drain", "orders", "[::1]:80"]).unwrap();
    let Command::Drain(args) = cli.command else {
        panic!("not drain")
    };
    assert_eq!(args.timeout, std::time::Duration::from_secs(30));
    assert!(!args.force);
    assert_eq!(
        args.instance.resolve().unwrap().addr.to_string(),
        "[::1]:80"
    );

    let err = parse(&["offline", "orders", "1.2.3.4:80", "--timeout", "5"]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
    let cli = parse(&[
        "offline",
        "orders",
        "1.2.3.4:80",
        "--wait",
        "--timeout",
        "500ms",
    ])
    .unwrap();
    let Command::Offline(args) = cli.command else {
        panic!("not offline")
    };
    assert_eq!(args.timeout, std::time::Duration::from_millis(500));
}

#[test]
fn heartbeat_once_and_every_exclude_each_other() {
    let err = parse(&["heartbeat", "o", "1.2.3.4:80", "--once", "--every", "1"]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ArgumentConflict);
}

/// The first line clap would print for a parse error (what `usage_error` prints for value errors).
fn value_error(args: &[&str]) -> String {
    let err = parse(args).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ValueValidation, "{args:?}: {err}");
    err.render().to_string().lines().next().unwrap().to_owned()
}

#[test]
fn non_finite_or_out_of_range_weights_are_refused() {
    for w in ["NaN", "nan", "inf", "-1", "10000.5", "heavy"] {
        let line = value_error(&["register", "orders", "1.2.3.4:80", "--weight", w]);
        assert!(
            line.starts_with(&format!("error: invalid value '{w}' for '--weight <W>': ")),
            "{line}"
        );
    }
    // `-inf` is no number to clap: it needs the `=` form.
    let line = value_error(&["register", "orders", "1.2.3.4:80", "--weight=-inf"]);
    assert!(
        line.contains("'--weight <W>': must be 0 or a number 0.001-10000, got -inf"),
        "{line}"
    );
    let cli = parse(&["register", "orders", "1.2.3.4:80", "-w", "0"]).unwrap();
    let Command::Register(args) = cli.command else {
        panic!("not register")
    };
    assert_eq!(args.weight, Some(0.0));
}

#[test]
fn a_zero_heartbeat_period_is_refused() {
    let line = value_error(&[
        "register",
        "orders",
        "1.2.3.4:80",
        "--keep-alive",
        "--every",
        "0",
    ]);
    assert!(line.contains("'--every <S>': must be above 0"), "{line}");
    let line = value_error(&["heartbeat", "orders", "1.2.3.4:80", "--every", "0ms"]);
    assert!(line.contains("'--every <S>': must be above 0"), "{line}");
}

#[test]
fn server_must_be_host_and_port() {
    for (server, needle) in [
        ("127.0.0.1", "missing :PORT"),
        ("127.0.0.1:99999", "port: must be 1-65535, got 99999"),
        ("127.0.0.1:0", "port: must be 1-65535, got 0"),
        ("", "empty address"),
        ("http://", "empty address"),
        ("localhost:http", "must be a number"),
        (":8848", "missing host"),
        ("::1:8848", "IPv6 addresses need brackets"),
        ("ftp://h:8848", "only http:// and https://"),
        ("https://h:8848/v1", "expected HOST:PORT"),
        ("h:8848/v1", "expected HOST:PORT"),
        ("a:1,,b:2", "address 2 of 3: empty address"),
        (
            "127.0.0.1:8848,h:0",
            "address 2 of 2: port: must be 1-65535",
        ),
    ] {
        let line = value_error(&["--server", server, "services"]);
        assert!(
            line.starts_with(&format!(
                "error: invalid value '{server}' for '--server <HOST:PORT>': "
            )) && line.contains(needle),
            "{server:?}: {line}"
        );
    }
    for server in [
        "127.0.0.1:8848",
        "localhost:8848",
        "[::1]:8848",
        "http://registry.internal:8848/",
        "https://registry.internal:8848",
        "10.0.0.1:8848,10.0.0.2:8848,[fd00::3]:8848",
    ] {
        let cli = parse(&["services", "--server", server]).unwrap();
        assert_eq!(cli.server, server);
    }
}

#[test]
fn empty_namespace_group_or_cluster_is_refused() {
    for args in [
        &["list", "orders", "--namespace", ""][..],
        &["list", "orders", "--group", ""][..],
        &["deregister", "orders", "1.2.3.4:80", "--cluster", ""][..],
        &["services", "-n", ""][..],
        &["services", "-g", ""][..],
    ] {
        let line = value_error(args);
        assert!(line.ends_with(": must not be empty"), "{args:?}: {line}");
    }
    let line = value_error(&["list", "orders", "-g", "a b"]);
    assert!(line.contains("'--group <GROUP>': may hold only"), "{line}");
}

#[test]
fn negative_numbers_reach_the_value_parser() {
    for (args, needle) in [
        (
            &["register", "o", "1.2.3.4:80", "--ttl", "-5"][..],
            "'--ttl <S>': must not be negative",
        ),
        (
            &["register", "o", "1.2.3.4:80", "--delete-timeout", "-5"][..],
            "'--delete-timeout <S>': must not be negative",
        ),
        (
            &["drain", "o", "1.2.3.4:80", "--timeout", "-1"][..],
            "'--timeout <S>': must not be negative",
        ),
        (
            &["offline", "o", "1.2.3.4:80", "--wait", "--timeout", "-1"][..],
            "'--timeout <S>': must not be negative",
        ),
        (
            &["heartbeat", "o", "1.2.3.4:80", "--every", "-1"][..],
            "'--every <S>': must not be negative",
        ),
        (
            &["watch", "o", "--count", "-1"][..],
            "'--count <N>': must be a whole number",
        ),
    ] {
        let line = value_error(args);
        assert!(line.contains(needle), "{args:?}: {line}");
    }
}

#[test]
fn an_address_starting_with_a_dash_is_a_bad_address_not_flags() {
    let line = value_error(&["register", "orders", "-host:8080"]);
    assert!(
        line.starts_with("error: invalid value '-host:8080' for '<IP:PORT>': host \"-host\""),
        "{line}"
    );
    // Flags still parse where the address would go.
    let cli = parse(&["register", "orders", "-n", "prod", "10.0.0.5:80"]).unwrap();
    let Command::Register(args) = cli.command else {
        panic!("not register")
    };
    assert_eq!(args.instance.service.namespace.as_deref(), Some("prod"));
    assert_eq!(args.instance.addr.to_string(), "10.0.0.5:80");
}

#[test]
fn an_invalid_log_filter_is_refused() {
    let line = value_error(&["server", "--log", "gangway=loud"]);
    assert!(
        line.starts_with("error: invalid value 'gangway=loud' for '--log <FILTER>': "),
        "{line}"
    );
    assert!(parse(&["server", "--log", "info,gangway_server=debug"]).is_ok());
}

#[test]
fn a_400_from_the_registry_is_a_bad_argument() {
    let e = CliError::from(RestError::from_answer(
        "h:1",
        400,
        Some("Bad Request"),
        r#"{"error":{"code":"invalid_argument","message":"must not be empty","field":"service"}}"#,
    ));
    assert_eq!(e.exit_code(), EXIT_USAGE);
    assert_eq!(e.to_string(), "service: must not be empty (HTTP 400)");
    let e = CliError::from(RestError::from_answer(
        "h:1",
        409,
        Some("Conflict"),
        r#"{"error":{"code":"conflict","message":"last instance","field":null}}"#,
    ));
    assert_eq!(e.exit_code(), EXIT_FAILURE);
}

#[test]
fn json_is_requested_unless_lab_or_bench_own_the_flag() {
    let argv = |args: &[&str]| -> Vec<String> {
        std::iter::once("gangway")
            .chain(args.iter().copied())
            .map(String::from)
            .collect()
    };
    assert!(json_requested(&argv(&[
        "list", "orders", "--json", "--nope"
    ])));
    assert!(json_requested(&argv(&["--json", "list"])));
    assert!(json_requested(&argv(&["-s", "h:1", "list", "--json"])));
    // `--server`'s value is not the subcommand, whatever it is called.
    assert!(json_requested(&argv(&[
        "--server", "bench", "list", "--json"
    ])));
    assert!(!json_requested(&argv(&["list", "orders"])));
    assert!(!json_requested(&argv(&["bench", "--json", "out.json"])));
    assert!(!json_requested(&argv(&[
        "--server", "h:1", "lab", "--json", "x"
    ])));
    assert!(!json_requested(&argv(&[
        "register",
        "o",
        "1.2.3.4:80",
        "--",
        "--json"
    ])));
}

#[test]
fn errors_as_json_keep_the_registry_shape() {
    let e = CliError::from(RestError::from_answer(
        "h:1",
        400,
        Some("Bad Request"),
        r#"{"error":{"code":"invalid_argument","message":"must not be empty","field":"service"}}"#,
    ));
    assert_eq!(
        e.to_json(),
        serde_json::json!({"error": {"code": "invalid_argument", "message": "must not be empty", "field": "service"}})
    );
    let e = CliError::from(RestError::from_answer("h:1", 502, Some("Bad Gateway"), ""));
    assert_eq!(
        e.to_json(),
        serde_json::json!({"error": {"code": "http_502", "message": "Bad Gateway", "field": null}})
    );
    let e = CliError::usage("--meta", "key \"a\" given twice");
    assert_eq!(e.to_string(), "--meta: key \"a\" given twice");
    assert_eq!(
        e.to_json(),
        serde_json::json!({"error": {"code": "invalid_argument", "message": "key \"a\" given twice", "field": "--meta"}})
    );
    // A message that starts with its flag is not prefixed twice.
    let e = CliError::usage("--lease-ttl", "--lease-ttl must be 100ms-1440m, got 1500m");
    assert_eq!(e.to_string(), "--lease-ttl must be 100ms-1440m, got 1500m");
    assert_eq!(e.exit_code(), EXIT_USAGE);
}

#[test]
fn server_flags_out_of_range_are_usage_errors() {
    let cli = parse(&["server", "--keepalive-timeout", "0", "--lease-ttl", "25h"]).unwrap();
    let Command::Server(args) = cli.command else {
        panic!("not server")
    };
    let err = args.config().unwrap_err();
    assert_eq!(err.exit_code(), EXIT_USAGE);
    assert_eq!(
        err.to_string(),
        "--keepalive-timeout must be 100ms-60m, got 0ms; --lease-ttl must be 100ms-1440m, got \
         1500m; --lease-delete-timeout must be at least --lease-ttl (1500m), got 30s"
    );
}

/// Every `gangway server` flag's default is the server configuration's own (no second copy of
/// a default as text: one drifted once).
#[test]
fn server_flag_defaults_are_the_config_defaults() {
    use clap::Parser;
    let cli = crate::Cli::try_parse_from(["gangway", "server"]).unwrap();
    let crate::Command::Server(args) = cli.command else {
        panic!("parsed as a server command")
    };
    let c = args.config().unwrap();
    let d = gangway_server::Config::default();
    assert_eq!(format!("{:?}", c), format!("{:?}", d));
}

/// Every parse error of `gangway run` is one line naming the argument, and its field.
#[test]
fn run_parse_errors_are_one_line_naming_the_argument() {
    let cases: [(&[&str], &str, &str); 6] = [
        (
            &[
                "run",
                "--service",
                "s",
                "--port",
                "1",
                "--registry",
                "127.0.0.1:99999",
                "--",
                "x",
            ],
            "--registry",
            "invalid value '127.0.0.1:99999' for '--registry <HOST:PORT>'",
        ),
        (
            &["run", "--port", "80", "--", "x"],
            "--service",
            "the following required arguments were not provided: --service <SERVICE>",
        ),
        (
            &["run", "--service", "s", "--port", "80"],
            "CMD",
            "the following required arguments were not provided: <CMD>...",
        ),
        (
            &["run", "--service", "s", "--port", "http", "--", "x"],
            "--port",
            "invalid value 'http' for '--port <PORT>': must be a port 1-65535, got \"http\"",
        ),
        (
            &[
                "run",
                "--service",
                "s",
                "--port",
                "1",
                "--grace",
                "soon",
                "--",
                "x",
            ],
            "--grace",
            "invalid value 'soon' for '--grace <DURATION>'",
        ),
        (
            &["run", "--service", "s", "--port", "1", "--nope", "--", "x"],
            "--nope",
            "unexpected argument '--nope' found",
        ),
    ];
    for (args, field, start) in cases {
        // The environment may name a service or a port: clap would take it.
        let args: Vec<&str> = args.to_vec();
        let err = parse(&args).unwrap_err();
        let (message, got) = parse_error(&err);
        assert!(message.starts_with(start), "{args:?}: {message}");
        assert!(!message.contains('\n'), "{args:?}: {message:?}");
        assert_eq!(got.as_deref(), Some(field), "{args:?}: {message}");
    }
}
