//! `gangway`: the command line of the gangway service registry.
//!
//! Registry commands talk to a running registry over its REST API (`--server`, default
//! `127.0.0.1:8848`): tables for people by default, the registry's raw JSON with `--json`.
//! Errors are one line on stderr and a non-zero exit status (2 for bad arguments, whether the
//! CLI caught them and sent nothing or the registry refused them with HTTP 400); with `--json`
//! they are the registry's error shape, `{"error": {"code", "message", "field"}}`, on stdout
//! instead, with the same exit status.
//!
//! Layout: [`Command`] lists the subcommands; each group lives in `commands/`, rendering in
//! `output`, argument parsers in `args`; the typed REST client is `gangway_wire::client`.

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{Parser, Subcommand};
use gangway_cli::args;

mod commands;
mod demo;
mod error;
mod instance_env;
mod output;
mod route;
mod run;
mod server;
mod tls;

use commands::{Context, drain, list, register, watch};
use error::{CliError, EXIT_FAILURE, EXIT_OK, EXIT_USAGE, error_json};

/// Default registry address (Nacos's default HTTP port).
pub const DEFAULT_SERVER: &str = "127.0.0.1:8848";

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "gangway",
    version,
    about = "gangway service registry: register instances, watch services, drain before shutdown",
    after_help = "Exit status: 0 done, 1 failed (refused by the registry, unreachable), 2 bad \
                  arguments (whether the CLI or the registry caught them), 3 drain timed out.",
    propagate_version = true,
    max_term_width = 100
)]
struct Cli {
    /// Registry REST address, HOST:PORT (or http://HOST:PORT, https://HOST:PORT for TLS), or
    /// several nodes of one registry, HOST:PORT,HOST:PORT: tried in that order while one does
    /// not answer (docs/cluster.md, "Client failover").
    #[arg(
        long,
        short = 's',
        global = true,
        help_heading = "Global options",
        env = "GANGWAY_SERVER",
        default_value = DEFAULT_SERVER,
        value_name = "HOST:PORT",
        value_parser = args::parse_server
    )]
    server: String,
    /// Print the registry's raw JSON answer instead of a table; errors too, as
    /// {"error": {"code", "message", "field"}} on stdout (same exit status).
    #[arg(long, global = true, help_heading = "Global options")]
    json: bool,
    /// API token (or login token) for a registry with --auth: sent as Authorization: Bearer
    /// (REST commands) or on the gRPC session (run, proxy, demo-service, demo-client).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "GANGWAY_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    token: Option<String>,
    /// TLS toward an https:// registry: --ca, --client-cert, --client-key.
    #[command(flatten)]
    tls: tls::TlsArgs,
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the registry (REST on --http, gRPC sessions on --grpc) until SIGINT/SIGTERM.
    Server(server::ServerArgs),
    /// Run the demo: registry, 3 demo-service processes, a client at 60 req/s, rolling restart.
    Demo(demo::rolling::DemoArgs),
    /// A small HTTP service that registers itself and drains before it exits on SIGTERM.
    DemoService(demo::service::ServiceArgs),
    /// Send GET /ping through a subscription at a fixed open-loop rate; print failures.
    DemoClient(demo::client::ClientArgs),
    /// Measure offline strategies with real processes: classic lease+pull vs gangway (docs/lab.md).
    Lab(gangway_lab::cli::LabPassthrough),
    /// Register an instance (ephemeral and lease-kept by default).
    Register(register::RegisterArgs),
    /// Keep an ephemeral instance's lease alive: heartbeats until Ctrl-C, or once.
    Heartbeat(register::HeartbeatArgs),
    /// Remove an instance.
    Deregister(register::DeregisterArgs),
    /// List a service's instances (the consumer view, or all with --all).
    List(list::ListArgs),
    /// List services with their revision, instance and subscriber counts.
    Services(list::ServicesArgs),
    /// Follow a service's consumer view as the registry pushes it.
    Watch(watch::WatchArgs),
    /// Take an instance out of rotation; with --wait, drain it (Kubernetes preStop).
    Offline(drain::OfflineArgs),
    /// Put an instance back into rotation; with --wait, until every subscriber acked it.
    Online(drain::OnlineArgs),
    /// Offline an instance and wait until every subscriber acked it (= offline --wait).
    Drain(drain::DrainArgs),
    /// Show a service's subscribers and the revision each has acked.
    Subscribers(list::SubscribersArgs),
    /// Run a program with the whole lifecycle: ready-gated registration, ack readiness, drain on
    /// SIGTERM, then the program's stop (docs/kubernetes.md).
    Run(run::RunArgs),
    /// Benchmark gangway side by side with rnacos and etcd (docs/benchmarks.md).
    Bench(gangway_bench::BenchPassthrough),
    /// Local HTTP proxy with the consumer pipeline, for programs in any language (docs/proxy.md).
    Proxy(gangway_proxy::ProxyArgs),
    /// Edit the users and API tokens of `gangway server --auth FILE` (docs/security.md).
    Auth(commands::auth::AuthArgs),
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    // `gangway lab` parses its own flags: its `--json FILE` is not the global `--json` switch.
    let cli = if argv.get(1).map(String::as_str) == Some("lab") {
        Cli {
            server: DEFAULT_SERVER.to_owned(),
            json: false,
            token: None,
            tls: tls::TlsArgs::default(),
            command: Command::Lab(gangway_lab::cli::LabPassthrough {
                args: argv[2..].to_vec(),
            }),
        }
    } else {
        match Cli::try_parse() {
            Ok(cli) => cli,
            Err(e) => return usage_error(e, json_requested(&argv)),
        }
    };
    // `gangway server --log` sets the filter; RUST_LOG overrides it; other commands log warnings.
    let default_filter = match &cli.command {
        Command::Server(a) => a.log.clone(),
        Command::Proxy(a) => a.log.clone(),
        _ => "warn".to_owned(),
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Command::Proxy(gangway_proxy::ProxyArgs {
        threads: Some(n), ..
    }) = &cli.command
    {
        builder.worker_threads(usize::from(*n));
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let json = cli.json;
    let outcome = runtime.block_on(run(cli));
    // The command's own work is done (the server released its store, the wrapper's child
    // exited): tasks still running (a blocking read, a connection closing) get
    // RUNTIME_SHUTDOWN, not as long as they like (seen: 1.2-1.9 s after "stopped").
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    match outcome {
        Ok(code) => code,
        Err(e) => report(&e, json),
    }
}

/// How long tasks still running when a command ends may take before the process exits:
/// 100 ms.
const RUNTIME_SHUTDOWN: std::time::Duration = std::time::Duration::from_millis(100);

/// Runs one command. Commands return a typed [`CliError`]; `anyhow` is for what main itself
/// starts (e.g. an embedded server).
async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // Read only by the commands that reach a registry, so a bad file fails no other command.
    let client_tls = || cli.tls.read();
    match cli.command {
        Command::Server(a) => return server::run(a).await.map(|()| ExitCode::from(EXIT_OK)),
        Command::Demo(a) => {
            return demo::rolling::run(a)
                .await
                .map(|()| ExitCode::from(EXIT_OK));
        }
        Command::DemoService(a) => {
            return demo::service::run(a, cli.token, client_tls()?)
                .await
                .map(|()| ExitCode::from(EXIT_OK));
        }
        Command::Proxy(a) => {
            let mut options = a.options(cli.token);
            options.tls = client_tls()?;
            return gangway_proxy::run(options)
                .await
                .map(|()| ExitCode::from(EXIT_OK));
        }
        Command::Bench(a) => {
            let a = match a.parse() {
                Ok(a) => a,
                Err(e) => return Ok(usage_error(e, false)),
            };
            return gangway_bench::run(a).await.map(|_| ExitCode::from(EXIT_OK));
        }
        Command::DemoClient(a) => {
            let report = demo::client::run(a, cli.token, client_tls()?).await?;
            return Ok(ExitCode::from(if report.failed == 0 {
                EXIT_OK
            } else {
                EXIT_FAILURE
            }));
        }
        Command::Run(a) => return run::run(a, cli.json, cli.token, client_tls()?).await,
        Command::Auth(a) => return commands::auth::run(a).map(|()| ExitCode::from(EXIT_OK)),
        Command::Lab(a) => {
            let a = match a.parse() {
                Ok(a) => a,
                Err(e) => return Ok(usage_error(e, false)),
            };
            let exe = std::env::current_exe()?;
            let complete = gangway_lab::cli::run(a, exe).await?;
            return Ok(ExitCode::from(if complete {
                EXIT_OK
            } else {
                EXIT_FAILURE
            }));
        }
        _ => {}
    }
    let ctx = Context::new(&cli.server, cli.token.as_deref(), &client_tls()?, cli.json)
        .map_err(CliError::from)?;
    let outcome = match cli.command {
        Command::Register(a) => register::register(&ctx, a).await,
        Command::Heartbeat(a) => register::heartbeat(&ctx, a).await,
        Command::Deregister(a) => register::deregister(&ctx, a).await,
        Command::List(a) => list::list(&ctx, a).await,
        Command::Services(a) => list::services(&ctx, a).await,
        Command::Watch(a) => watch::watch(&ctx, a).await,
        Command::Offline(a) => drain::offline(&ctx, a).await,
        Command::Online(a) => drain::online(&ctx, a).await,
        Command::Drain(a) => drain::drain(&ctx, a).await,
        Command::Subscribers(a) => list::subscribers(&ctx, a).await,
        Command::Server(_)
        | Command::Demo(_)
        | Command::DemoService(_)
        | Command::DemoClient(_)
        | Command::Lab(_)
        | Command::Run(_)
        | Command::Bench(_)
        | Command::Proxy(_)
        | Command::Auth(_) => {
            unreachable!("handled above")
        }
    };
    Ok(outcome?)
}

/// Prints `error: ...` (one line on stderr; with `json`, the error object on stdout) and picks
/// the exit status.
fn report(e: &anyhow::Error, json: bool) -> ExitCode {
    let (text, object, code) = match e.downcast_ref::<CliError>() {
        Some(c) if c.is_broken_pipe() => return ExitCode::from(EXIT_OK),
        Some(c) => (c.to_string(), c.to_json(), c.exit_code()),
        None => {
            let text = format!("{e:#}");
            let object = error_json("failed", &text, None);
            (text, object, EXIT_FAILURE)
        }
    };
    if json {
        // Nothing else to tell when stdout itself is gone.
        let _ = output::emit(&object.to_string());
    } else {
        eprintln!("error: {text}");
    }
    ExitCode::from(code)
}

/// Whether `--json` was asked for on a command line clap could not parse: a `--json` before
/// any `--`, unless the subcommand is `lab` or `bench`, whose `--json FILE` is their own.
fn json_requested(argv: &[String]) -> bool {
    let args: Vec<&str> = argv
        .iter()
        .skip(1)
        .map(String::as_str)
        .take_while(|a| *a != "--")
        .collect();
    let mut rest = args.iter();
    // The subcommand is the first word that is neither a flag nor `--server`'s value.
    while let Some(arg) = rest.next() {
        match *arg {
            "--server" | "-s" => {
                rest.next();
            }
            a if a.starts_with('-') => {}
            "lab" | "bench" => return false,
            _ => break,
        }
    }
    args.contains(&"--json")
}

/// Help and version print as clap does. Every other parse error is one line naming the
/// argument at fault (`error: invalid value 'x' for '--port <PORT>': ...`, `error: the following
/// required arguments were not provided: --service <SERVICE>`), exit 2; with `json` it is the
/// error object on stdout instead (code `invalid_argument`, `field` the argument at fault when
/// clap names one), exit 2 all the same.
fn usage_error(e: clap::Error, json: bool) -> ExitCode {
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { EXIT_OK });
        }
        _ => {}
    }
    let (message, field) = parse_error(&e);
    if json {
        let _ =
            output::emit(&error_json("invalid_argument", &message, field.as_deref()).to_string());
    } else {
        eprintln!("error: {message}");
    }
    ExitCode::from(EXIT_USAGE)
}

/// A clap error as one line (without `error: `) and the argument it is about, e.g. `--port`.
fn parse_error(e: &clap::Error) -> (String, Option<String>) {
    use clap::error::{ContextKind, ContextValue};
    let args: Vec<&str> = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => vec![arg.as_str()],
        Some(ContextValue::Strings(args)) => args.iter().map(String::as_str).collect(),
        _ => Vec::new(),
    };
    // `--port <PORT>` is the flag `--port`; `<CMD>...` the positional `CMD`.
    let field = args.first().and_then(|a| {
        a.split_whitespace()
            .next()
            .map(|a| a.trim_matches(|c| matches!(c, '<' | '>' | '.')).to_owned())
    });
    let message = match e.kind() {
        // clap lists them on lines of their own below its first.
        ErrorKind::MissingRequiredArgument if !args.is_empty() => format!(
            "the following required arguments were not provided: {}",
            args.join(", ")
        ),
        _ => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("error: invalid arguments");
            first.strip_prefix("error: ").unwrap_or(first).to_owned()
        }
    };
    (message, field)
}

#[cfg(test)]
mod tests;
