//! `gangway lab`: the flags and the command. The `gangway` binary flattens [`LabArgs`] and calls
//! [`run`] with its own path (the demo-service children are that binary).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, ValueEnum};

use crate::report;
use crate::scenario::{self, Action, Mode, Params, Scenario};
use crate::suite;

/// Which suite to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Suite {
    /// The four tables: classic crash, classic deregister-first, retry, gangway.
    Default,
    /// How the registry sees an instance go (sessions, probes, protect threshold, restart).
    Liveness,
    /// A rolling restart of N instances (default 10) per strategy: kill, deregister + sleep,
    /// gangway run; failed requests and total rollout time.
    Rollout,
    /// An instance joining cold (503 or slow at first): registered at once, ready-gated,
    /// ready-gated + warm-up; failed requests and latency during the join.
    ColdStart,
}

/// How the instance leaves (`--scenario`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ActionArg {
    /// SIGKILL, no deregistration.
    Crash,
    /// SIGSTOP.
    Freeze,
    /// Deregister, wait --wait, SIGKILL.
    DeregisterKill,
    /// Deregister, wait --wait, SIGTERM (graceful exit).
    DeregisterGraceful,
    /// gangway drain (offline + every subscriber's ack), then graceful exit.
    Drain,
}

/// Registry behaviour (`--registry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// Lease (--ttl, heartbeats every TTL/3) and a consumer that pulls every --refresh.
    Classic,
    /// Sessions, push with acks.
    Gangway,
}

/// `gangway lab` as a parser of its own: its `--json FILE` (a file to write) is not the
/// `gangway --json` switch of the registry commands, so the `gangway` binary hands everything
/// after `lab` ([`LabPassthrough`]) to this parser.
#[derive(Debug, Parser)]
#[command(
    name = "gangway lab",
    about = "Measure offline strategies with real processes: classic lease + pull versus gangway \
             sessions + push + acks. Prints tables; docs/lab.md explains them.",
    max_term_width = 100
)]
pub struct LabCommand {
    /// The flags.
    #[command(flatten)]
    pub args: LabArgs,
}

/// The `lab` entry of the `gangway` command line: the arguments after `lab`, unparsed (see
/// [`LabCommand`]).
#[derive(Debug, Clone, Args)]
#[command(disable_help_flag = true)]
pub struct LabPassthrough {
    /// Arguments of `gangway lab` (`gangway lab --help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<String>,
}

impl LabPassthrough {
    /// Parses the arguments.
    ///
    /// # Errors
    /// clap's error (help and version included), to print and exit with.
    pub fn parse(&self) -> Result<LabArgs, clap::Error> {
        LabCommand::try_parse_from(
            std::iter::once("gangway lab".to_owned()).chain(self.args.iter().cloned()),
        )
        .map(|c| c.args)
    }
}

/// Flags of `gangway lab`. Durations take `500ms`, `2.8s`, `1m`; a bare number is seconds.
#[derive(Debug, Clone, Args)]
pub struct LabArgs {
    /// `default` (the four tables), `liveness`, `rollout` or `cold-start`.
    #[arg(value_enum, default_value = "default")]
    pub suite: Suite,
    /// Run one configuration instead of a suite: how the instance leaves (with --registry,
    /// --ttl, --refresh, --wait, --retry).
    #[arg(long, value_enum, value_name = "ACTION")]
    pub scenario: Option<ActionArg>,
    /// --scenario: registry behaviour.
    #[arg(long, value_enum, default_value = "gangway")]
    pub registry: ModeArg,
    /// --scenario, classic: lease TTL (heartbeats every TTL/3).
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub ttl: Duration,
    /// --scenario, classic: consumer refresh interval R.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub refresh: Duration,
    /// --scenario, deregister-*: wait W between deregistration and the signal.
    #[arg(long, default_value = "0s", value_parser = parse_duration, value_name = "DURATION")]
    pub wait: Duration,
    /// --scenario: the consumer retries once on another instance.
    #[arg(long)]
    pub retry: bool,
    /// A short suite for CI: one or two rows per table, 4 s of load, action at 1.4 s.
    #[arg(long)]
    pub quick: bool,
    /// Instances N [default: 3; rollout: 10].
    #[arg(long)]
    pub instances: Option<usize>,
    /// rollout: the fixed wait W of the deregister + sleep strategy.
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub sleep: Duration,
    /// cold-start: how long the joining instance is cold.
    #[arg(long, default_value = "3s", value_parser = parse_duration, value_name = "DURATION")]
    pub cold: Duration,
    /// cold-start: extra latency of a slow cold instance at its start (shrinks to 0).
    #[arg(long, default_value = "600ms", value_parser = parse_duration, value_name = "DURATION")]
    pub cold_latency: Duration,
    /// cold-start: the warm-up window of the warm-up rows.
    #[arg(long, default_value = "4s", value_parser = parse_duration, value_name = "DURATION")]
    pub warmup: Duration,
    /// Requests per second, open loop.
    #[arg(long, default_value_t = 60.0)]
    pub rate: f64,
    /// Sending time.
    #[arg(long, default_value = "8s", value_parser = parse_duration, value_name = "DURATION")]
    pub duration: Duration,
    /// When the instance leaves, after the first send.
    #[arg(long, default_value = "2.8s", value_parser = parse_duration, value_name = "DURATION")]
    pub action_at: Duration,
    /// In-flight time of each request (GET /ping answers after this).
    #[arg(long, default_value = "200ms", value_parser = parse_duration, value_name = "DURATION")]
    pub delay: Duration,
    /// Timeout of each attempt.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Duration,
    /// gangway sessions: HTTP/2 keepalive ping interval.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub keepalive_interval: Duration,
    /// gangway sessions: keepalive timeout (a frozen peer's session ends after interval +
    /// timeout).
    #[arg(long, default_value = "3s", value_parser = parse_duration, value_name = "DURATION")]
    pub keepalive_timeout: Duration,
    /// Longest drain wait.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub drain_timeout: Duration,
    /// Classic consumer: its first poll after the registry dropped the instance comes this
    /// fraction of R later (0 = at once, 0.5 = the mean of a random phase, 0.99 = just missed).
    #[arg(long, default_value_t = 0.5, value_parser = parse_fraction, value_name = "0..1")]
    pub poll_phase: f64,
    /// Classic instance: its last heartbeat before the leave action comes this fraction of
    /// TTL/3 before it (0.1 = just before: nearly the longest lease left, 0.5 = the mean; 0
    /// races the signal and leaves the phase to chance).
    #[arg(long, default_value_t = 0.5, value_parser = parse_fraction, value_name = "0..1")]
    pub heartbeat_phase: f64,
    /// Scenarios run at the same time (each with its own registry and ports).
    #[arg(long, default_value_t = 3)]
    pub concurrency: usize,
    /// liveness: how long to watch a persistent instance whose port stopped listening.
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub observe: Duration,
    /// Write all raw results (one record per request) to FILE as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw per scenario a timeline of requests to FILE as SVG.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

impl LabArgs {
    /// Scenario parameters from the flags (`--quick` shortens the run).
    pub fn params(&self, exe: PathBuf) -> Params {
        let mut p = Params::new(exe);
        p.instances = self.instances.unwrap_or(match self.suite {
            Suite::Rollout if self.quick => 3,
            Suite::Rollout => 10,
            _ => 3,
        });
        p.rate = self.rate;
        p.duration = self.duration;
        p.action_at = self.action_at;
        p.delay = self.delay;
        p.timeout = self.timeout;
        p.keepalive_interval = self.keepalive_interval;
        p.keepalive_timeout = self.keepalive_timeout;
        p.drain_timeout = self.drain_timeout;
        p.poll_phase = self.poll_phase;
        p.heartbeat_phase = self.heartbeat_phase;
        if self.quick {
            p.duration = Duration::from_secs(4);
            p.action_at = Duration::from_millis(1400);
        }
        p
    }

    /// The `--scenario` configuration, if given.
    pub fn scenario(&self) -> Option<Scenario> {
        let action = match self.scenario? {
            ActionArg::Crash => Action::Crash,
            ActionArg::Freeze => Action::Freeze,
            ActionArg::DeregisterKill => Action::DeregisterKill { wait: self.wait },
            ActionArg::DeregisterGraceful => Action::DeregisterGraceful { wait: self.wait },
            ActionArg::Drain => Action::Drain,
        };
        let mode = match self.registry {
            ModeArg::Classic => Mode::Classic {
                ttl: self.ttl,
                refresh: self.refresh,
            },
            ModeArg::Gangway => Mode::Gangway,
        };
        Some(Scenario {
            mode,
            action,
            retry: self.retry,
        })
    }
}

/// Runs `gangway lab`; `exe` is the `gangway` executable. Prints the tables on stdout, the
/// progress bar on stderr. Returns whether every scenario ran (a failed *request* is a result,
/// not an error).
///
/// # Errors
/// Bad flag combinations; the JSON or SVG file cannot be written.
pub async fn run(args: LabArgs, exe: PathBuf) -> anyhow::Result<bool> {
    anyhow::ensure!(
        args.rate > 0.0 && args.rate.is_finite(),
        "--rate must be above 0"
    );
    let params = args.params(exe.clone());
    anyhow::ensure!(params.instances >= 2, "--instances must be at least 2");
    if matches!(args.suite, Suite::Rollout | Suite::ColdStart) {
        anyhow::ensure!(
            args.scenario.is_none(),
            "--scenario belongs to the default suite"
        );
        return match args.suite {
            Suite::Rollout => run_rollout(&args, params).await,
            _ => run_cold_start(&args, params).await,
        };
    }
    anyhow::ensure!(
        params.action_at < params.duration,
        "--action-at must fall inside --duration"
    );
    if args.suite == Suite::Liveness {
        anyhow::ensure!(
            args.scenario.is_none(),
            "--scenario belongs to the default suite"
        );
        let rows = crate::liveness::run(&crate::liveness::Settings {
            exe,
            observe: args.observe,
            keepalive_interval: args.keepalive_interval,
            keepalive_timeout: args.keepalive_timeout,
            progress: !args.no_progress,
        })
        .await?;
        println!("{}", crate::liveness::render(&rows));
        return Ok(rows.iter().all(|r| r.error.is_none()));
    }
    let tables = match args.scenario() {
        Some(s) => vec![suite::Table {
            title: s.label(),
            rows: vec![suite::Row {
                scenario: s,
                reference: "-".to_owned(),
            }],
        }],
        None if args.quick => suite::quick_suite(),
        None => suite::default_suite(),
    };
    println!(
        "gangway lab: {} instance(s), {} req/s for {} ({} requests), leave at {}, in-flight {}, \
         attempt timeout {}",
        params.instances,
        params.rate,
        scenario::secs(params.duration),
        params.schedule().total(),
        scenario::secs(params.action_at),
        scenario::secs(params.delay),
        scenario::secs(params.timeout)
    );
    let results = suite::run(&tables, &params, args.concurrency, !args.no_progress).await;
    for t in &tables {
        println!("\n{}", report::render_table(t, &results));
    }
    if let Some(path) = &args.json {
        report::write_json(path, &params, &tables, &results)?;
        println!("\nraw results: {}", path.display());
    }
    if let Some(path) = &args.svg {
        report::write_svg(path, &params, &results)?;
        println!("timelines: {}", path.display());
    }
    Ok(results.iter().all(|(_, r)| r.is_ok()))
}

async fn run_rollout(args: &LabArgs, params: Params) -> anyhow::Result<bool> {
    let mut rows = crate::rollout::default_rows(args.ttl, args.refresh, args.sleep);
    if args.quick {
        rows = vec![rows[1].clone(), rows[3].clone()];
    }
    println!(
        "gangway lab rollout: {} instances replaced one by one (surge first) under {} req/s, \
         in-flight {}, attempt timeout {}, no retry",
        params.instances,
        params.rate,
        scenario::secs(params.delay),
        scenario::secs(params.timeout)
    );
    let settings = crate::rollout::Settings {
        params,
        rows,
        concurrency: args.concurrency,
        progress: !args.no_progress,
    };
    let results = crate::rollout::run(&settings).await;
    println!("{}", crate::rollout::render(&settings.rows, &results));
    if let Some(path) = &args.json {
        write_results(path, &settings.params, &results)?;
        println!("\nraw results: {}", path.display());
    }
    Ok(results.iter().all(|(_, r)| r.is_ok()))
}

async fn run_cold_start(args: &LabArgs, mut params: Params) -> anyhow::Result<bool> {
    let mut rows = crate::cold_start::default_rows();
    let (mut cold, mut warmup) = (args.cold, args.warmup);
    if args.quick {
        rows = vec![rows[0], rows[1], rows[5]];
        cold = cold.min(Duration::from_millis(1500));
        warmup = warmup.min(Duration::from_secs(2));
        params.action_at = Duration::from_millis(1000);
    }
    anyhow::ensure!(
        params.action_at < params.duration,
        "--action-at must fall inside --duration"
    );
    let settings = crate::cold_start::Settings {
        params,
        cold,
        latency: args.cold_latency,
        warmup,
        rows,
        concurrency: args.concurrency,
    };
    let results = crate::cold_start::run(&settings).await;
    println!("{}", crate::cold_start::render(&settings, &results));
    if let Some(path) = &args.json {
        write_results(path, &settings.params, &results)?;
        println!("\nraw results: {}", path.display());
    }
    Ok(results.iter().all(|(_, r)| r.is_ok()))
}

/// Writes `{"params": .., "results": [{"row": .., "result" | "error": ..}]}` to `path`.
fn write_results<R: serde::Serialize, T: serde::Serialize>(
    path: &std::path::Path,
    params: &Params,
    results: &[(R, Result<T, String>)],
) -> anyhow::Result<()> {
    let results: Vec<serde_json::Value> = results
        .iter()
        .map(|(row, r)| match r {
            Ok(r) => serde_json::json!({ "row": row, "result": r }),
            Err(e) => serde_json::json!({ "row": row, "error": e }),
        })
        .collect();
    let file = std::fs::File::create(path)
        .map_err(|e| anyhow::anyhow!("create {}: {e}", path.display()))?;
    serde_json::to_writer(
        std::io::BufWriter::new(file),
        &serde_json::json!({ "params": params, "results": results }),
    )
    .map_err(|e| anyhow::anyhow!("write {}: {e}", path.display()))
}

/// Parses a fraction in 0..1 (1 excluded).
///
/// # Errors
/// Not a number, or outside 0..1.
pub fn parse_fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("expected a number in 0..1, got {s:?}"))?;
    if (0.0..1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("must be at least 0 and below 1, got {v}"))
    }
}

pub use gangway_core::duration::parse as parse_duration;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<LabArgs, clap::Error> {
        LabPassthrough {
            args: args.iter().map(|s| s.to_string()).collect(),
        }
        .parse()
    }

    #[test]
    fn defaults_are_issue_4s() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.suite, Suite::Default);
        let p = a.params("gangway".into());
        assert_eq!((p.instances, p.rate, p.schedule().total()), (3, 60.0, 480));
        assert_eq!(p.action_at, Duration::from_millis(2800));
        assert_eq!(p.delay, Duration::from_millis(200));
        assert!(a.scenario().is_none());
    }

    #[test]
    fn scenario_flags_make_one_configuration() {
        let a = parse(&[
            "--scenario",
            "deregister-graceful",
            "--registry",
            "classic",
            "--ttl",
            "4s",
            "--refresh",
            "500ms",
            "--wait",
            "1.2s",
            "--retry",
            "--json",
            "out.json",
        ])
        .unwrap();
        assert_eq!(
            a.scenario(),
            Some(Scenario {
                mode: Mode::Classic {
                    ttl: Duration::from_secs(4),
                    refresh: Duration::from_millis(500)
                },
                action: Action::DeregisterGraceful {
                    wait: Duration::from_millis(1200)
                },
                retry: true,
            })
        );
        assert_eq!(a.json.as_deref(), Some(std::path::Path::new("out.json")));
        let quick = parse(&["--quick"]).unwrap().params("g".into());
        assert_eq!(quick.schedule().total(), 240);
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(parse(&["--rate", "fast"]).is_err());
        assert!(parse(&["--poll-phase", "1"]).is_err());
        assert!(parse(&["--duration", "-1s"]).is_err());
        assert!(parse(&["--ttl", "2 weeks"]).is_err());
        assert!(parse(&["nonsense"]).is_err());
        assert_eq!(parse_duration("2.8s"), Ok(Duration::from_millis(2800)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_fraction("0"), Ok(0.0));
        assert!(parse_fraction("-0.1").is_err());
    }
}
