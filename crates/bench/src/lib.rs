//! `gangway bench`: the registry's speed, scale and memory, side by side with real peers
//! (issue 6).
//!
//! The bench starts each system itself on loopback ports ([`system`]: gangway as a child
//! `gangway server`, rnacos, etcd), runs the same workload against each in turn through thin
//! protocol [`drivers`], stops it, and prints one table per workload ([`report`]) with the
//! client's and server's CPU time ([`stats`]) and the ratio of gangway to each peer. Load is
//! closed loop for throughput and open loop for latency ([`load`], HdrHistogram).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use clap::Parser;
//! let cli = gangway_bench::BenchCommand::parse_from(["bench", "register", "--quick", "--peers", "gangway,etcd"]);
//! gangway_bench::run(cli.args).await?;
//! # Ok(()) }
//! ```
//!
//! Speed targets live in docs/benchmarks.md and in the printed tables, never in timed tests.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Parser};

pub mod drivers;
pub mod load;
pub mod report;
pub mod stats;
pub mod system;
pub mod workloads;

pub use system::System;
pub use workloads::{Params, Selection, ServiceBatch, Workload};

/// `gangway bench` as a parser of its own: its `--json FILE` is not the `gangway --json` switch
/// of the registry commands, so the `gangway` binary hands everything after `bench`
/// ([`BenchPassthrough`]) to this parser.
#[derive(Debug, Parser)]
#[command(
    name = "gangway bench",
    about = "Benchmark gangway side by side with rnacos and etcd: starts each server on loopback \
             ports, runs the same workload against each, prints a table per workload \
             (docs/benchmarks.md).",
    max_term_width = 100
)]
pub struct BenchCommand {
    /// The flags.
    #[command(flatten)]
    pub args: BenchArgs,
}

/// The `bench` entry of the `gangway` command line: the arguments after `bench`, unparsed (see
/// [`BenchCommand`]).
#[derive(Debug, Clone, Args)]
#[command(disable_help_flag = true)]
pub struct BenchPassthrough {
    /// Arguments of `gangway bench` (`gangway bench --help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<String>,
}

impl BenchPassthrough {
    /// Parses the arguments.
    ///
    /// # Errors
    /// clap's error (help included), to print and exit with.
    pub fn parse(&self) -> Result<BenchArgs, clap::Error> {
        BenchCommand::try_parse_from(
            std::iter::once("gangway bench".to_owned()).chain(self.args.iter().cloned()),
        )
        .map(|c| c.args)
    }
}

/// Flags of `gangway bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// The workload to run.
    #[arg(value_enum)]
    pub workload: Selection,
    /// Systems to run, in order (comma-separated): gangway, rnacos, etcd, and gangway-cluster
    /// (3 gangway nodes on 3 etcd members; only where named: register, fanout and drain have
    /// its rows). A system that is not installed gets a row saying so.
    #[arg(long, value_delimiter = ',', default_value = "gangway,rnacos,etcd")]
    pub peers: Vec<System>,
    /// Write the raw numbers, the machine and the versions as JSON to FILE.
    #[arg(long = "json", value_name = "FILE")]
    pub json_file: Option<PathBuf>,
    /// Small sizes and short phases: `bench all --quick` finishes in under a minute (CI).
    #[arg(long)]
    pub quick: bool,
    /// Closed-loop phase length in seconds (register, query, durable).
    #[arg(long, value_name = "SECONDS")]
    pub seconds: Option<f64>,
    /// Closed-loop clients.
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Open-loop rate for the latency columns, requests/s.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Subscriber counts of the fan-out workload, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub fanout_sizes: Option<Vec<usize>>,
    /// Changes per fan-out size.
    #[arg(long)]
    pub fanout_changes: Option<usize>,
    /// Instances and subscribers of the churn workload.
    #[arg(long)]
    pub churn: Option<usize>,
    /// Sessions of the scale workload (10 instances each).
    #[arg(long)]
    pub sessions: Option<usize>,
    /// Target of gangway's largest-session-count probe.
    #[arg(long)]
    pub max_sessions: Option<usize>,
    /// Persistent services of the restart workload, comma-separated SERVICESxINSTANCES (full
    /// run: 5x20000,1000x100; quick: 2x1000,20x50).
    #[arg(long, value_delimiter = ',', value_name = "NxM")]
    pub restart_services: Option<Vec<ServiceBatch>>,
    /// How long the restarted server may take to list every instance, in seconds (full run
    /// 300, quick 60).
    #[arg(long, value_name = "SECONDS")]
    pub restart_deadline: Option<f64>,
    /// Subscribers of the drain workload (full run 100, quick 30).
    #[arg(long)]
    pub drain_subscribers: Option<usize>,
    /// Drains of the drain workload (full run 20, quick 5).
    #[arg(long)]
    pub drains: Option<usize>,
    /// Fail (after printing every table) when a row of an installed system could not be
    /// measured; CI runs the quick bench with it so the harness never rots.
    #[arg(long)]
    pub strict: bool,
    /// The gangway binary to start as the server (default: this one).
    #[arg(long, value_name = "PATH")]
    pub gangway_bin: Option<PathBuf>,
    /// The rnacos binary (searched on PATH and in ~/.cargo/bin).
    #[arg(long, value_name = "PATH", default_value = "rnacos")]
    pub rnacos_bin: PathBuf,
    /// The etcd binary.
    #[arg(long, value_name = "PATH", default_value = "etcd")]
    pub etcd_bin: PathBuf,
}

impl BenchArgs {
    /// The sizes these flags ask for.
    pub fn params(&self) -> Params {
        let mut p = if self.quick {
            Params::quick()
        } else {
            Params::full()
        };
        if let Some(s) = self.seconds {
            p.duration = std::time::Duration::from_secs_f64(s.max(0.1));
        }
        if let Some(c) = self.concurrency {
            p.concurrency = c.max(1);
        }
        if let Some(r) = self.rate {
            p.open_rate = r.max(1.0);
        }
        if let Some(s) = &self.fanout_sizes {
            p.fanout_sizes = s.clone();
        }
        if let Some(c) = self.fanout_changes {
            p.fanout_changes = c.max(1);
        }
        if let Some(c) = self.churn {
            p.churn = c.max(1);
        }
        if let Some(s) = self.sessions {
            p.sessions = s.max(1);
        }
        if let Some(s) = self.max_sessions {
            p.max_sessions = s.max(1);
        }
        if let Some(s) = &self.restart_services {
            p.restart_services = s.clone();
        }
        if let Some(n) = self.drain_subscribers {
            p.drain_subscribers = n.max(1);
        }
        if let Some(n) = self.drains {
            p.drains = n.max(1);
        }
        if let Some(s) = self.restart_deadline {
            p.restart_deadline = std::time::Duration::from_secs_f64(s.max(1.0));
        }
        p
    }
}

/// Runs the bench: every requested workload against every requested system; prints the tables
/// on stdout (progress on stderr) and writes the JSON report if asked. Fails only when the
/// report cannot be written; a system that fails gets a row saying why.
pub async fn run(args: BenchArgs) -> anyhow::Result<report::Report> {
    let fds = stats::raise_fd_limit();
    let bins = system::Binaries {
        gangway: match &args.gangway_bin {
            Some(p) => p.clone(),
            None => std::env::current_exe().context("locating the gangway binary")?,
        },
        rnacos: args.rnacos_bin.clone(),
        etcd: args.etcd_bin.clone(),
    };
    let machine = stats::Machine::current();
    let mut versions = BTreeMap::new();
    for &s in &args.peers {
        versions.insert(s.name().to_owned(), bins.version(s));
    }
    println!(
        "gangway bench {}{}: {} cores, {:.1} GiB, {} (open files: {fds})",
        args.workload.name(),
        if args.quick { " --quick" } else { "" },
        machine.cores,
        machine.memory_bytes as f64 / (1u64 << 30) as f64,
        versions
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let ctx = workloads::Ctx {
        params: args.params(),
        bins,
        systems: args.peers.clone(),
    };
    let mut tables = Vec::new();
    for w in args.workload.workloads() {
        // On SIGINT/SIGTERM the workload is dropped, and with it every server it started
        // (a `Server` kills its process on drop).
        let table = tokio::select! {
            t = w.run(&ctx) => t,
            s = interrupted() => anyhow::bail!("interrupted by {s}; the servers it started are stopped"),
        };
        println!("{}", table.render());
        tables.push(table);
    }
    let report = report::Report {
        date: report::utc_now(),
        quick: args.quick,
        machine,
        versions,
        tables,
    };
    if let Some(path) = &args.json_file {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("raw numbers written to {}", path.display());
    }
    let failed = report.failures();
    if args.strict && !failed.is_empty() {
        anyhow::bail!(
            "{} rows could not be measured: {}",
            failed.len(),
            failed.join("; ")
        );
    }
    Ok(report)
}

/// Resolves on SIGINT or SIGTERM, naming it.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        },
        _ => std::future::pending().await,
    }
}
