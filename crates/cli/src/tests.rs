use clap::CommandFactory;
use clap::error::ErrorKind;

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
    assert!(req.ephemeral);
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
    assert!(!req.ephemeral);
    let probe = req.probe.unwrap();
    assert_eq!(
        (probe.kind.as_str(), probe.path.as_deref()),
        ("http", Some("/ready"))
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
            "'<IP:PORT>': port: must be 1-65535, got 0",
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
    assert_eq!(args.instance.addr.to_string(), "[::1]:80");

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
